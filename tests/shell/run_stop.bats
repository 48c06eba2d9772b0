#!/usr/bin/env bats
# run.sh --stop: it stops the run that is live on the log path (a multi-node run through its stop request,
# a single-node run.sh by SIGTERM), and is never fooled by the record of an earlier multi-node run.

bats_require_minimum_version 1.5.0

setup() {
  load run_record
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  CLI=(env PYTHONPATH="$ROOT" "$(envs_python app)" -m coordinator)
  LOG="$BATS_TEST_TMPDIR/log"
  mkdir -p "$LOG"
  BG=()
}

teardown() {
  local pid
  for pid in "${BG[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}

# start_time <pid>: the start time of <pid> (field 22 of /proc/<pid>/stat, after the command name), as an
# owner record holds it (coordinator/driver/procs.py's start_time).
start_time() {
  local stat
  local -a fields
  stat=$(<"/proc/$1/stat")
  stat=${stat##*) }
  read -r -a fields <<<"$stat"
  printf '%s\n' "${fields[19]}"
}

# live_single_node: a process that owns the rollout role of rank 0 as a single-node run.sh does
# (run/rank_0/owner.rollout: host pid start time); sets OWNER.
live_single_node() {
  sleep 300 3>&- &
  OWNER=$!
  BG+=("$OWNER")
  mkdir -p "$LOG/run/rank_0"
  printf '%s %s %s\n' "$(hostname)" "$OWNER" "$(start_time "$OWNER")" >"$LOG/run/rank_0/owner.rollout"
}

# stale_multi_node: cluster/run.json of an earlier multi-node run whose master (on this host) and heartbeat
# have exited, its heartbeat file frozen; sets STALE (its run id).
stale_multi_node() {
  local dead
  sleep 0 &
  dead=$!
  wait "$dead"
  STALE=$(start_run "$LOG" 2 "$dead")
  mkdir -p "$LOG/cluster/runs/$STALE/heartbeat"
  printf '7 1700000000.000 %s %s\n' "$(hostname)" "$dead" >"$LOG/cluster/runs/$STALE/heartbeat/rank_0"
}

@test "--stop stops the live single-node run.sh, not the stale record of an earlier multi-node run" {
  stale_multi_node
  live_single_node
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --stop --log-path "$LOG"
  [[ $stderr == *"sent SIGTERM to run.sh (pid $OWNER, rollout)"* ]]
  [[ $stderr == *"run $STALE on $LOG is not running"*"not asking it to stop"* ]]
  [ ! -e "$LOG/cluster/runs/$STALE/stop.json" ]
  local rc=0
  wait "$OWNER" || rc=$?
  [ "$rc" = 143 ]
}

@test "--stop asks a live multi-node run to stop: its heartbeat sees the request" {
  sleep 300 3>&- &
  local master=$!
  BG+=("$master")
  local run_id
  run_id=$(start_run "$LOG" 2 "$master")
  "${CLI[@]}" heartbeat --log-path "$LOG" --run-id "$run_id" --rank 0 --node-pid "$master" 3>&- &
  local beat=$!
  BG+=("$beat")
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --stop --log-path "$LOG"
  [[ $stderr == *"asked run $run_id to stop: run.sh --stop by"* ]]
  [[ $stderr == *"every node of the run stops within a heartbeat interval; resume later with --resume"* ]]
  [ -e "$LOG/cluster/runs/$run_id/stop.json" ]
  local rc=0
  wait "$beat" || rc=$?
  [ "$rc" = 4 ]
}
