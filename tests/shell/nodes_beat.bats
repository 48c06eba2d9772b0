#!/usr/bin/env bats
# nodes.sh's heartbeat watch: a node's heartbeat that dies while run.sh waits for a phase (loop_wait) is started
# again at once, before the other ranks count the node dead; one that keeps dying stops the node; one that
# ended the node on purpose is left alone. The heartbeat is a stub (`sleep`); the e2e runs the real one and
# bench/chaos_nodes.py kills it.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_NUM_NODES=2 RUN_RANK=1
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
  [ "$rc" -eq 7 ] && [ -z "$NODES_BEAT_PID" ] && [ ! -s "$BATS_TEST_TMPDIR/err" ]
  run ! procs_leader_alive "$LOOP_RUN_DIR" heartbeat
}

@test "a single node has no heartbeat: loop_wait is wait" {
  NODES_BEAT_PID=""
  local rc=0
  (exit 5) &
  loop_wait $! || rc=$?
  [ "$rc" -eq 5 ] && [ ! -e "$LOOP_RUN_DIR/pids/heartbeat.pgid" ]
}
