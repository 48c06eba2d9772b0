#!/usr/bin/env bats
# nodes.sh around the protocol: a node's heartbeat that dies while run.sh waits for a phase (loop_wait) is
# started again at once, before the other ranks count the node dead; one that keeps dying stops the node; one
# that ended the node on purpose is left alone (the heartbeat is a stub, `sleep`; the e2e runs the real one and
# bench/chaos_nodes.py kills it). The end of a run: the master that ran the last step says so (finished.json),
# and a node its heartbeat stopped for that reason exits 0.

bats_require_minimum_version 1.5.0

setup() {
  load hang_bound
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_NUM_NODES=2 RUN_RANK=1 RUN_PHASE=both
  LOOP_RUN_DIR="$RUN_LOG/run/rank_1" NODES_BEAT=heartbeat NODES_ENDED="$LOOP_RUN_DIR/ended"
  NODES_BEAT_RESTARTS=0 NODES_BEAT_CMD=(sleep 60)
  mkdir -p "$LOOP_RUN_DIR/logs"
}

teardown() {
  procs_stop "$LOOP_RUN_DIR" heartbeat 1
}

# beat_pid: the recorded heartbeat group's pid.
beat_pid() {
  procs_pgid "$LOOP_RUN_DIR" heartbeat
}

# start_master: nodes_start of rank 0 of 2, the protocol CLI stubbed, the heartbeat a fake python that sleeps.
start_master() {
  RUN_RANK=0 RUN_RANK_WEIGHTS=1,1 RUN_NODE_ADDR="" RUN_ON_FAILURE=abort LOOP_PORT=8999 LOOP_ROOT=$ROOT
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0" NODES_ENDED="$RUN_LOG/run/rank_0/ended"
  mkdir -p "$LOOP_RUN_DIR/logs"
  BATON_APP_PY="$BATS_TEST_TMPDIR/python"
  printf '#!/usr/bin/env bash\nexec sleep 60\n' >"$BATON_APP_PY" && chmod +x "$BATON_APP_PY"
  # shellcheck disable=SC2329 # called by nodes_start
  {
    nodes_cli() { if [[ $1 == start-run ]]; then echo run1; else printf 'master_addr\t127.0.0.1\n'; fi; }
    loop_free_port() { echo 29555; }
    iteration_next() { echo 1; }
  }
  nodes_start 2>/dev/null
}

@test "a heartbeat killed while the node waits for a phase is started again, and the wait gets the phase's exit" {
  start_master
  local first phase rc=0
  first=$(beat_pid)
  procs_leader_alive "$LOOP_RUN_DIR" heartbeat
  (sleep 1.5 && exit 7) &
  phase=$!
  (sleep 0.3 && kill -KILL "$first") &
  loop_wait "$phase" 2>"$BATS_TEST_TMPDIR/err" || rc=$?
  [ "$rc" -eq 7 ]
  [ "$(beat_pid)" != "$first" ]
  procs_leader_alive "$LOOP_RUN_DIR" heartbeat
  # (bash's own job report, "... Killed setsid ...", comes first)
  [ "$(tail -n 1 "$BATS_TEST_TMPDIR/err")" = "[baton] warning: the heartbeat of rank 0 exited (killed by SIGKILL) while this node runs; starting it again (1 of 3) before the other ranks count this node dead" ]
  [[ $(cat "$LOOP_RUN_DIR/pids/heartbeat.pgid") == "$(beat_pid) "* ]]
}

@test "a heartbeat killed during a phase with deadlines (a rollout, the update check) is started again while it runs" {
  start_master
  local first phase rc=0
  first=$(beat_pid)
  sleep 30 &
  phase=$!
  (sleep 0.3 && kill -KILL "$first") &
  # the phase's 4 s deadline ends the wait while the phase still runs: the restart happened during the phase
  loop_wait_for "$phase" 4 0 2>"$BATS_TEST_TMPDIR/err" || rc=$?
  kill "$phase"
  [ "$rc" -eq 124 ]
  [ "$(beat_pid)" != "$first" ]
  procs_leader_alive "$LOOP_RUN_DIR" heartbeat
  grep -Fxq "[baton] warning: the heartbeat of rank 0 exited (killed by SIGKILL) while this node runs; starting it again (1 of 3) before the other ranks count this node dead" "$BATS_TEST_TMPDIR/err"
}

@test "a continue run's barriers and members name the workers the step was planned with, none as ''" {
  # shellcheck disable=SC2329 # called by nodes_wait_bg and nodes_members
  nodes_cli() {
    printf '%s\n' "$*" >>"$BATS_TEST_TMPDIR/calls"
    [[ $1 != members ]] || printf 'members\t0\n'
  }
  NODES_RUN_ID=r1 NODES_ON_FAILURE=continue NODES_PLANNED=""
  local -A now=()
  nodes_wait_bg /dev/null 2 train_rollout
  nodes_members 0 now "$NODES_PLANNED"
  NODES_PLANNED=1=n1:42:7
  nodes_wait_bg /dev/null 2 train_rollout
  NODES_ON_FAILURE=abort
  nodes_wait_bg /dev/null 2 train_rollout
  run cat "$BATS_TEST_TMPDIR/calls"
  [ "${lines[0]}" = "wait --run-id r1 --rank 1 --iteration 2 --phase train_rollout --planned " ]
  [ "${lines[1]}" = "members --run-id r1 --rank 0 --wait-all 0 --planned " ]
  [ "${lines[2]}" = "wait --run-id r1 --rank 1 --iteration 2 --phase train_rollout --planned 1=n1:42:7" ]
  [ "${lines[3]}" = "wait --run-id r1 --rank 1 --iteration 2 --phase train_rollout" ]
  [ "${#lines[@]}" -eq 4 ]
}

# signalled_wait: in run.sh's strict mode, a heartbeat beside the node and a SIGUSR1 to this shell while it waits
# for a phase (the master's heartbeat sends one when it evicts a rank), trapped as run.sh traps it (loop_evicted).
signalled_wait() {
  set -Eeuo pipefail
  trap 'LOOP_SIGNALLED=1' USR1
  start_master
  (sleep 1.5 && exit 7) &
  local phase=$! rc=0 me=$BASHPID
  (sleep 0.3 && kill -USR1 "$me") &
  loop_wait "$phase" || rc=$?
  procs_stop "$LOOP_RUN_DIR" heartbeat 1
  printf 'phase exit %s\n' "$rc"
}

@test "a signal that cuts the wait short (the eviction's SIGUSR1) is waited through beside the heartbeat" {
  run --separate-stderr signalled_wait
  [[ $stderr != *"unbound variable"* ]]
  [ "$status" -eq 0 ]
  [ "$output" = "phase exit 7" ]
  [[ $stderr != *"starting it again"* ]] # the heartbeat lived on
}

# train_beside_a_failed_partner: a node's part of a training (30 s) while another node's part fails at once (the
# protocol's partner-failed stubbed: it finds rank 0's failed arrival after 0.3 s); loop_stop_update stubbed to
# record the stop and end the part. Prints the part's exit code and the seconds waited.
train_beside_a_failed_partner() {
  start_master
  LOOP_UPDATE_RUNNING=3
  # shellcheck disable=SC2329 # called by nodes_watch_partners and nodes_partner_failed
  {
    nodes_cli() { [[ $1 == partner-failed ]] && sleep 0.3 && printf '0\t1\n'; }
    loop_stop_update() { echo stopped >"$BATS_TEST_TMPDIR/stop" && kill "$part"; }
  }
  local part rc=0 began=$SECONDS
  sleep 30 &
  part=$!
  nodes_watch_partners 3
  loop_wait "$part" || rc=$?
  nodes_unwatch_partners
  procs_stop "$LOOP_RUN_DIR" heartbeat 1
  printf '%s %s\n' "$rc" $((SECONDS - began))
}

@test "a node whose training partner's part failed stops its own part instead of waiting for it" {
  run --separate-stderr train_beside_a_failed_partner
  [ "$status" -eq 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/stop")" = stopped ]
  read -r rc waited <<<"$output"
  [ "$rc" -eq 143 ]
  # stopped its part at once: had it waited for it, the part would have ended by itself after 30 s
  hang_bound 25 $((SECONDS - waited)) "the stop of this node's part after its partner's part failed"
  [[ $stderr == *"warning: the update of iteration 3: rank 0's part of the training failed (exit 1); it cannot finish without it: stopping this node's part instead of waiting for it"* ]]
  [ -z "$(find "$RUN_LOG/run/rank_0" -name '.partner.*')" ]
}

# wait_for_phase: a heartbeat that exits at once, and a phase of 30 s to wait for (in `run`'s subshell: its children).
wait_for_phase() {
  NODES_BEAT_CMD=(false)
  nodes_beat_start
  sleep 30 &
  loop_wait $!
}

@test "a heartbeat that keeps dying stops the node after 3 restarts (exit 1, naming its log)" {
  run -1 --separate-stderr wait_for_phase
  [ "$(grep -c 'starting it again' <<<"$stderr")" -eq 3 ]
  [[ $stderr == *"error: the heartbeat of rank 1 exited (exit 1) a 4th time (log: $LOOP_RUN_DIR/logs/heartbeat.log); without it the other ranks count this node dead: stopping it. Start it again with --resume (docs/multinode.md)"* ]]
}

@test "a heartbeat that ended the node on purpose (its reason written) is not started again" {
  nodes_beat_start
  local first phase rc=0
  first=$(beat_pid)
  printf '3\trank 0: dead: no heartbeat change seen for 10 s\n' >"$NODES_ENDED"
  (sleep 1 && exit 7) &
  phase=$!
  (sleep 0.3 && kill -TERM "$first") &
  loop_wait "$phase" 2>"$BATS_TEST_TMPDIR/err" || rc=$?
  [ "$rc" -eq 7 ]
  [ -z "$NODES_BEAT_PID" ]
  [ ! -s "$BATS_TEST_TMPDIR/err" ]
  run ! procs_leader_alive "$LOOP_RUN_DIR" heartbeat
}

@test "a single node has no heartbeat: loop_wait is wait" {
  NODES_BEAT_PID=""
  local rc=0
  (exit 5) &
  loop_wait $! || rc=$?
  [ "$rc" -eq 5 ]
  [ ! -e "$LOOP_RUN_DIR/pids/heartbeat.pgid" ]
}

# leave <rank> <rc> [ended]: nodes_leave <rc> of <rank> of 2 (run r1) in a shell of its own, with the heartbeat's
# reason [ended] ("<code>\t<why>") if given; the protocol subcommands it runs go to $BATS_TEST_TMPDIR/calls, and
# the shell exits with the code run.sh would.
leave() {
  [[ -z ${3:-} ]] || printf '%s\n' "$3" >"$BATS_TEST_TMPDIR/ended"
  # shellcheck disable=SC2016 # the inner bash's own script, expanded when it runs
  run --separate-stderr bash -c 'source "$1"; source "$2"; source "$3"
    calls=$4
    nodes_cli() { printf "%s\n" "$*" >>"$calls"; }
    NODES_RUN_ID=r1 RUN_RANK=$5 RUN_NUM_NODES=2 NODES_ENDED=$6
    nodes_leave "$7"
    exit "$NODES_EXIT"' _ "$ROOT/scripts/lib/common.sh" "$ROOT/scripts/lib/slurm.sh" "$ROOT/scripts/lib/nodes.sh" \
    "$BATS_TEST_TMPDIR/calls" "$1" "$BATS_TEST_TMPDIR/ended" "$2"
}

@test "the master that ran the last step says the run finished; a failed or stopped master does not" {
  leave 0 0
  [ "$status" -eq 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/calls")" = "finish --run-id r1 --reason the master (rank 0) ran the run's last step and exited" ]
  rm "$BATS_TEST_TMPDIR/calls"
  leave 0 1
  [ "$status" -eq 1 ]
  [[ $(cat "$BATS_TEST_TMPDIR/calls") == "fail --run-id r1 --rank 0 "* ]]
  rm "$BATS_TEST_TMPDIR/calls"
  leave 1 0 # a worker's end says nothing of the run's
  [ "$status" -eq 0 ]
  [ ! -e "$BATS_TEST_TMPDIR/calls" ]
}

@test "a worker whose heartbeat saw the run finished exits 0 saying so, not that the master died" {
  leave 1 143 "$(printf '6\tthe run finished: the master (rank 0) ran the run'"'"'s last step and exited')"
  [ "$status" -eq 0 ]
  [ ! -e "$BATS_TEST_TMPDIR/calls" ]
  [ "$stderr" = "[baton] the run finished: the master (rank 0) ran the run's last step and exited; this node stops" ]
}

@test "a barrier that ends because the run finished ends the node with exit 0" {
  run --separate-stderr nodes_exit 6 "the plan barrier of step 2"
  [ "$status" -eq 0 ]
  [ "$stderr" = "[baton] the plan barrier of step 2: the run finished (the master ran its last step and exited); this node stops" ]
}

@test "a master of a superseded run writes no marker of run/state and stops (exit 143)" {
  source "$ROOT/scripts/lib/iteration.sh"
  # shellcheck disable=SC2329 # called by nodes_fence: the protocol's answer for a superseded run
  nodes_cli() {
    printf '%s\n' "$*" >>"$BATS_TEST_TMPDIR/calls"
    return 4
  }
  NODES_RUN_ID=r1 RUN_RANK=0
  run --separate-stderr loop_mark "$RUN_LOG" 2 train_rollout
  [ "$status" -eq 143 ]
  [ ! -e "$RUN_LOG/run/state/iter_0002/train_rollout.done" ]
  [ "$(cat "$BATS_TEST_TMPDIR/calls")" = "fence --run-id r1" ]
  [ "$stderr" = "[baton] the run was asked to stop (marking train_rollout of iteration 2); this node stops" ]
  NODES_RUN_ID="" # a single node has no run: nothing to fence
  loop_mark "$RUN_LOG" 2 train_rollout
  [ -f "$RUN_LOG/run/state/iter_0002/train_rollout.done" ]
}
