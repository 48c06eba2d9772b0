#!/usr/bin/env bats
# loop.sh's deadlines: loop_wait_for (a total deadline, a stall deadline on a
# progress signal), loop_run stopping a stuck rollout's group, and
# loop_policy_answers against a server that never answers. Real processes stand
# in for the rollout (sleep). What loop_rollout_run does with a stuck rollout
# (exit 124) is in loop_rollout.bats.

bats_require_minimum_version 1.5.0

setup() {
  load hang_bound
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_DEBUG=0 RUN_NUM_NODES=1 RUN_RANK=0 LOOP_N=1
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0" LOOP_POLICY_DOWN=75 LOOP_POLICY_RESTARTS=3 LOOP_WATCH=watch
  BATON_PROGRESS_S=0
  JOURNAL="$RUN_LOG/trajectories/train/iter_0001/rank_0.jsonl"
  mkdir -p "$LOOP_RUN_DIR/logs" "$(dirname "$JOURNAL")"
}

# waited <cmd...>: run <cmd> in this shell (wait needs its own child, and bats' run is a subshell);
# OUT is then its exit code and LOOP_EXPIRED.
waited() {
  local rc=0
  "$@" || rc=$?
  OUT="$rc $LOOP_EXPIRED"
}

# constant: a progress signal that never changes.
constant() { printf 'same\n'; }

# clock: a progress signal that changes every second.
clock() { date +%s; }

@test "loop_wait_for: the process's own exit code when it ends in time" {
  bash -c 'sleep 1; exit 3' &
  waited loop_wait_for $! 30 30 constant
  [ "$OUT" = "3 " ]
}

@test "loop_wait_for: no progress for stall_s seconds returns 124 and says so" {
  sleep 300 &
  local pid=$! start=$SECONDS
  waited loop_wait_for "$pid" 0 3 constant
  [ "$OUT" = "124 no progress for 3s (no episode finished; BATON_ROLLOUT_STALL_S)" ]
  # returned after its 3 s stall deadline: without it, it would wait for the 300 s sleep
  hang_bound 60 "$start" "loop_wait_for's return after a 3 s stall"
  kill "$pid"
}

@test "loop_wait_for: progress keeps a long phase alive past stall_s" {
  bash -c 'sleep 6; exit 0' &
  waited loop_wait_for $! 0 3 clock
  [ "$OUT" = "0 " ]
}

@test "loop_wait_for: past total_s it returns 124 even with progress" {
  sleep 300 &
  local pid=$!
  waited loop_wait_for "$pid" 3 0 clock
  [ "$OUT" = "124 still running after 3s (its deadline)" ]
  kill "$pid"
}

@test "loop_run: a rollout whose journal stops growing is stopped as a whole group (exit 124)" {
  LOOP_STALL_S=3 LOOP_ROLLOUT_S=0
  # a 'rollout' that journals one episode, then hangs with a child in its group
  run -124 --separate-stderr loop_run rollout-train "$LOOP_RUN_DIR/logs/r.log" \
    bash -c "echo '{}' >>'$JOURNAL'; sleep 399.3 & sleep 399.3; wait"
  [[ $stderr == *"rollout-train: no progress for 3s (no episode finished; BATON_ROLLOUT_STALL_S); stopping it"* ]]
  [ ! -e "$LOOP_RUN_DIR/pids/rollout-train.pgid" ]
  run -1 pgrep -xf 'sleep 399.3'
}

@test "loop_run: a rollout that keeps journaling is not stopped by the stall deadline" {
  LOOP_STALL_S=3 LOOP_ROLLOUT_S=0
  run -0 --separate-stderr loop_run rollout-train "$LOOP_RUN_DIR/logs/r.log" \
    bash -c "for i in 1 2 3 4 5 6; do echo '{}' >>'$JOURNAL'; sleep 1; done"
  [ "$(wc -l <"$JOURNAL")" -eq 6 ]
}

@test "loop_policy_answers: false within its 10 s for a server that accepts connections and never answers" {
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # a listening socket that nobody accepts from: the kernel completes the handshake, no reply ever comes
  python3 -c "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(8); time.sleep(60)" &
  local pid=$! start=$SECONDS
  sleep 0.5
  LOOP_BASE_URL="http://127.0.0.1:$port/v1"
  run ! loop_policy_answers
  # false after its 10 s: without that limit it would wait until the server exits (60 s)
  hang_bound 45 "$start" "loop_policy_answers' answer from a server that never replies"
  kill "$pid"
}
