#!/usr/bin/env bats
# loop.sh's loop_stop_update: the update's recorded groups are signalled only while
# their pids still name the recorded leaders (start time), never a reused pid.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log"
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0"
  LOOP_UPDATE_RUNNING=1
  GROUPS_FILE="$RUN_LOG/training/iter_0001/train.log.pgid"
  mkdir -p "$LOOP_RUN_DIR/pids" "$(dirname "$GROUPS_FILE")"
  BG=()
}

teardown() {
  local pid
  for pid in "${BG[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}

# leader <cmd...>: start <cmd> as the leader of a session of its own; sets LEADER.
leader() {
  setsid "$@" &
  LEADER=$!
  BG+=("$LEADER")
}

@test "loop_stop_update never signals a recorded pid that now names another process" {
  leader sleep 300
  other=$LEADER
  printf '%s 1\n' "$other" >"$LOOP_RUN_DIR/pids/update.pgid" # the update ended; its pid was reused
  leader sleep 300
  reused=$LEADER
  printf '%s 1\n' "$reused" >"$GROUPS_FILE"
  run -0 loop_stop_update
  kill -0 "$other"
  kill -0 "$reused"
  [[ $output == *"update: the recorded pid $other now names another process; not signalled"* ]]
  [ ! -e "$LOOP_RUN_DIR/pids/update.pgid" ]
}

@test "loop_stop_update stops the recorded update and SIGKILLs a listed worker group that is still the recorded one" {
  leader sleep 300
  update=$LEADER
  printf '%s %s\n' "$update" "$(procs_start_time "$update")" >"$LOOP_RUN_DIR/pids/update.pgid"
  leader bash -c 'trap "" TERM; sleep 300 & wait' # a worker group that outlives its launcher
  worker=$LEADER
  printf '%s %s\n' "$worker" "$(procs_start_time "$worker")" >"$GROUPS_FILE"
  run -0 loop_stop_update
  run -1 procs_group_alive "$update"
  run -1 procs_group_alive "$worker"
  [ ! -e "$LOOP_RUN_DIR/pids/update.pgid" ]
}
