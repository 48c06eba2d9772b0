#!/usr/bin/env bats
# The heartbeat process (`python -m coordinator heartbeat`, coordinator/protocol_cli.py), as the driver starts it
# beside each node: it beats until SIGTERM, the run's stop request or its node's exit, with the exit codes the
# driver relies on. The rest of the protocol runs in the driver's process: tests/unit/coordinator/.

bats_require_minimum_version 1.5.0

setup() {
  load hang_bound
  load run_record
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  cd "$ROOT" || return 1
  CLI=("$(envs_python app)" -m coordinator)
  LOG="$BATS_TEST_TMPDIR/log"
  BG=()
  RUN=$(start_run "$LOG" 3 $$)
}

teardown() {
  local pid
  for pid in "${BG[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}

# wait_rc <pid>: wait for a background process and set RC to its exit code (`run wait` cannot: a subshell).
wait_rc() {
  RC=0
  wait "$1" || RC=$?
}

# bg <cmd...>: run <cmd> in the background (stopped by teardown); sets LAST to its pid.
bg() {
  "$@" 3>&- &
  LAST=$!
  BG+=("$LAST")
}

# beat <rank> [args...]: a heartbeat process for <rank> in the background; sets LAST.
beat() {
  bg "${CLI[@]}" heartbeat --log-path "$LOG" --run-id "$RUN" --rank "$@"
}

# seq_of <rank>: the sequence number in <rank>'s heartbeat file (0 while there is none).
seq_of() {
  local line
  line=$(cat "$LOG/cluster/runs/$RUN/heartbeat/rank_$1" 2>/dev/null) || line=0
  printf '%s\n' "${line%% *}"
}

@test "a heartbeat renews its sequence and exits 0 soon after SIGTERM" {
  beat 0
  local i first
  for ((i = 0; i < 50; i++)); do (($(seq_of 0) > 0)) && break || sleep 0.1; done
  first=$(seq_of 0)
  ((first > 0))
  # it goes on renewing it (every 0.1 s; 30 s of looking only fails a heartbeat that stopped)
  for ((i = 0; i < 300; i++)); do (($(seq_of 0) >= first + 2)) && break || sleep 0.1; done
  (($(seq_of 0) >= first + 2))
  kill -TERM "$LAST"
  # it sleeps at most an interval (0.1 s) before it sees the signal: one that did not would beat on
  ends_within 30 "$LAST" "the heartbeat after SIGTERM"
  wait_rc "$LAST"
  [ "$RC" = 0 ] # its own clean exit, not SIGTERM's default death (143)
}

@test "a heartbeat ends by itself when the run is asked to stop (exit 4)" {
  beat 1
  run -0 "${CLI[@]}" stop --log-path "$LOG" --reason "operator request"
  wait_rc "$LAST"
  [ "$RC" = 4 ]
}

@test "a heartbeat stops (exit 1) when its node's process is gone, so a dead node never looks alive" {
  bg sleep 300
  local node=$LAST
  beat 1 --node-pid "$node" 2>"$BATS_TEST_TMPDIR/beat.err"
  sleep 0.3
  kill "$node"
  wait_rc "$LAST"
  [ "$RC" = 1 ]
  [ "$(cat "$BATS_TEST_TMPDIR/beat.err")" = "[baton] heartbeat of rank 1: its node's process $node exited; stopping" ]
}
