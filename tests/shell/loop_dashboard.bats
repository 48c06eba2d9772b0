#!/usr/bin/env bats
# loop.sh's dashboard: with --dashboard-port it is a tracked process group of the run (named per role like
# the live view), it serves the page on 127.0.0.1, and procs_stop (what loop_cleanup runs) stops it.
# run.sh --dry-run prints its command (needs the app environment).

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  fake_data_setup
  source "$ROOT/scripts/lib/envs.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  envs_export
  RUN_LOG="$LOG" RUN_RANK=0 RUN_DASHBOARD_PORT=""
}

teardown() {
  [[ -z ${LOOP_RUN_DIR:-} ]] || procs_stop "$LOOP_RUN_DIR" dashboard 5
}

# free_port: print a TCP port nothing listens on now.
free_port() {
  "$BATON_APP_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

@test "the dashboard is a group of the run only with --dashboard-port, named per role" {
  RUN_PHASE=both loop_setup
  [[ " ${LOOP_GROUPS[*]} " != *" dashboard "* && -z $LOOP_DASHBOARD ]]
  RUN_DASHBOARD_PORT=8080 RUN_PHASE=both loop_setup
  [[ " ${LOOP_GROUPS[*]} " == *" dashboard "* ]]
  RUN_DASHBOARD_PORT=8080 RUN_PHASE=update loop_setup
  [[ " ${LOOP_GROUPS[*]} " == *" dashboard-update "* ]]
}

@test "loop_dashboard_start serves the page until procs_stop stops its group" {
  RUN_DASHBOARD_PORT=$(free_port) RUN_PHASE=rollout
  loop_setup
  mkdir -p "$LOOP_RUN_DIR/logs" "$RUN_LOG"
  run -0 --separate-stderr loop_dashboard_start
  [[ $stderr == *"dashboard: http://127.0.0.1:$RUN_DASHBOARD_PORT/"* ]]
  local pgid i
  pgid=$(procs_pgid "$LOOP_RUN_DIR" dashboard)
  for ((i = 0; i < 100; i++)); do
    "$BATON_APP_PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
      "http://127.0.0.1:$RUN_DASHBOARD_PORT/api/state" 2>/dev/null && break
    sleep 0.2
  done
  ((i < 100)) || {
    cat "$LOOP_RUN_DIR/logs/dashboard.log" >&2
    return 1
  }
  procs_stop "$LOOP_RUN_DIR" dashboard 5
  run -1 procs_group_alive "$pgid"
  [ ! -e "$LOOP_RUN_DIR/pids/dashboard.pgid" ]
  grep -q "dashboard: stopped" "$LOOP_RUN_DIR/logs/dashboard.log"
}

@test "--dry-run prints the dashboard's command" {
  # shellcheck disable=SC2153 # DATA is set by fake_data_setup
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update --dry-run \
    --dashboard-port 8765
  [[ $output == *"[dashboard (for the whole run)] env PYTHONPATH=$ROOT "*" -m coordinator dashboard --log-path $LOG --port 8765 --host 127.0.0.1"* ]]
  [ ! -e "$LOG" ]
}
