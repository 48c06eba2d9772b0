#!/usr/bin/env bats
# procs.sh: tracked process groups are stopped exactly, children included.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  RUN="$BATS_TEST_TMPDIR/run"
}

@test "procs_start records a group whose children procs_stop ends" {
  pgid=$(procs_start "$RUN" job "$RUN/job.log" bash -c 'sleep 300 & sleep 300 & wait')
  [ "$(procs_pgid "$RUN" job)" = "$pgid" ]
  [ "$(cat "$RUN/pids/job.pgid")" = "$pgid $(procs_start_time "$pgid")" ]
  sleep 0.3
  [ "$(pgrep -g "$pgid" | wc -l)" -ge 3 ]
  run -0 procs_stop "$RUN" job 5
  run -1 procs_group_alive "$pgid"
  [ ! -e "$RUN/pids/job.pgid" ]
}

@test "procs_stop escalates to SIGKILL for a group that ignores SIGTERM" {
  pgid=$(procs_start "$RUN" stubborn "$RUN/s.log" bash -c 'trap "" TERM; sleep 300 & trap "" TERM; wait')
  sleep 0.3
  run -0 procs_stop "$RUN" stubborn 1
  [[ $output == *"ignored SIGTERM for 1s; sending SIGKILL"* ]]
  run -1 procs_group_alive "$pgid"
}

@test "procs_stop: a stopped group (SIGSTOP) handles its SIGTERM at once" {
  pgid=$(procs_start "$RUN" frozen "$RUN/f.log" bash -c "trap 'echo handled >$RUN/term; exit 0' TERM; while :; do sleep 0.1; done")
  sleep 0.3
  kill -STOP -- "-$pgid"
  run -0 procs_stop "$RUN" frozen 10
  [[ $output != *"ignored SIGTERM"* ]]
  [ "$(cat "$RUN/term")" = handled ]
  run -1 procs_group_alive "$pgid"
}

@test "procs_stop leaves processes it did not start alone" {
  sleep 300 &
  local outsider=$!
  pgid=$(procs_start "$RUN" job "$RUN/job.log" sleep 300)
  procs_stop "$RUN" job 5
  run -1 procs_group_alive "$pgid"
  kill -0 "$outsider"
  kill "$outsider"
}

@test "procs_stop of an unknown name is a no-op" {
  run -0 procs_stop "$RUN" nothing
}

@test "procs_stop_stale stops a group whose recorded leader still runs, and only forgets one whose pid was reused" {
  pgid=$(procs_start "$RUN" left "$RUN/l.log" bash -c 'sleep 300 & wait')
  sleep 0.3
  run -0 procs_stop_stale "$RUN" left
  [[ $output == *"left (group $pgid) was left running by an earlier run; stopping it"* ]]
  run -1 procs_group_alive "$pgid"
  # a record whose pid now names another process (another start time): never signalled
  sleep 300 &
  local other=$!
  printf '%s 1\n' "$other" >"$RUN/pids/reused.pgid"
  run -0 procs_stop_stale "$RUN" reused
  kill -0 "$other"
  [ ! -e "$RUN/pids/reused.pgid" ]
  kill "$other"
}

@test "procs_claim: a lock held past the wait is an error naming the lock and the wait; nothing is claimed" {
  mkdir -p "$RUN"
  (
    exec {fd}>>"$RUN/owner.lock"
    flock "$fd"
    : >"$RUN/locked"
    exec sleep 30 # the holder itself: killing it frees the lock
  ) &
  local holder=$!
  while [[ ! -e $RUN/locked ]]; do sleep 0.05; done
  run -2 --separate-stderr procs_claim "$RUN" update 1
  [ "$stderr" = "[baton] error: waited 1s for the lock $RUN/owner.lock to claim update; another process holds it (check: fuser $RUN/owner.lock)" ]
  [ -z "$output" ]
  [ ! -e "$RUN/owner.update" ]
  kill "$holder"
  wait "$holder" || true
  run -0 procs_claim "$RUN" update 1
  [ -e "$RUN/owner.update" ]
}

@test "procs_stop never signals a recorded pid that now names another process" {
  setsid sleep 300 &
  local other=$!
  mkdir -p "$RUN/pids"
  printf '%s 1\n' "$other" >"$RUN/pids/job.pgid" # the job ended and its pid was reused
  run -0 procs_stop "$RUN" job 1
  kill -0 "$other"
  [ "$output" = "[baton] warning: job: the recorded pid $other now names another process; not signalled" ]
  [ ! -e "$RUN/pids/job.pgid" ]
  kill "$other"
}
