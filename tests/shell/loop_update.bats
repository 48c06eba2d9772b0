#!/usr/bin/env bats
# loop.sh's loop_update: how the update's exit code decides what the loop does next
# (the update itself is stubbed: this is the logic around it; e2e tests run the real one).

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_PHASE=update RUN_DEBUG=0 RUN_NUM_NODES=1 RUN_RANK=0 RUN_MAX_FAILURES=3
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0" LOOP_FAILURES=0 LOOP_RESUME=0 LOOP_PINNED=0
  mkdir -p "$LOOP_RUN_DIR/logs"
  # shellcheck disable=SC2329 # called by loop_update
  loop_update_cmd() { LOOP_CMD=(true); }
}

# update_exits <code>: the stubbed update ends with <code>.
update_exits() {
  UPDATE_RC=$1
  # shellcheck disable=SC2329 # called by loop_update
  loop_run() { return "$UPDATE_RC"; }
}

@test "exit 2 (bad input the update alone can see) stops the loop at once with exit 2, naming the log" {
  update_exits 2
  run -2 --separate-stderr loop_update 1
  [[ $stderr == *"iteration 1: the update rejected its input (see $LOOP_RUN_DIR/logs/iter_0001.update.log); fix the configuration"* ]]
  [ "$(cat "$RUN_LOG/run/state/iter_0001/update.done")" = "failed (exit 2: bad input)" ]
}

@test "exit 1 is a failed update: the loop goes on until --max-update-failures in a row" {
  update_exits 1
  loop_update 1
  loop_update 2
  [ "$LOOP_FAILURES" -eq 2 ]
  [ "$(cat "$RUN_LOG/run/state/iter_0002/update.done")" = "failed (exit 1)" ]
  run -1 --separate-stderr loop_update 3
  [[ $stderr == *"3 updates failed in a row (--max-update-failures 3)"* ]]
}

@test "exit 3 (too little to train on) keeps the policy and is no failure" {
  update_exits 3
  loop_update 1
  [ "$LOOP_FAILURES" -eq 0 ]
  [ "$(cat "$RUN_LOG/run/state/iter_0001/update.done")" = "skipped: too little to train on" ]
}

@test "--resume after a training that finished but was not promoted runs phase=promote only" {
  # shellcheck disable=SC2329 # called by loop_update: record which phase it was asked for
  loop_update_cmd() { LOOP_CMD=(phase "$2"); }
  # shellcheck disable=SC2329
  loop_run() { echo "${*:3}" >>"$BATS_TEST_TMPDIR/phases"; }
  mkdir -p "$RUN_LOG/training/iter_0003/output"
  printf '{}\n' >"$RUN_LOG/training/iter_0003/output/config.json"
  printf '{"kind": "training", "iteration": 3, "steps": 1}\n' >"$RUN_LOG/metrics.jsonl"
  LOOP_RESUME=0 loop_update 3 # not a resume: train again
  rm -f "$RUN_LOG/run/state/iter_0003/update.done"
  LOOP_RESUME=1 loop_update 3 # the finished training, its record written: promote it
  rm -f "$RUN_LOG/run/state/iter_0003/update.done"
  printf '{"kind": "training", "iteration": 4, "steps": 1}\n' >"$RUN_LOG/metrics.jsonl"
  LOOP_RESUME=1 loop_update 3 # no record of iteration 3's training (a torn end): train again
  [ "$(cat "$BATS_TEST_TMPDIR/phases")" = "$(printf 'phase all\nphase promote\nphase all')" ]
}
