#!/usr/bin/env bats
# loop.sh's update-check: loop_check_start runs the check as a tracked group,
# loop_check_wait turns its exit code into the run's (the check itself is
# stubbed; tests/e2e/test_llamafactory_check.py runs the real one).

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_PHASE=update LOOP_ROOT=$ROOT
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0"
  CHECK_LOG="$LOOP_RUN_DIR/logs/update-check.log"
  mkdir -p "$LOOP_RUN_DIR/logs"
}

# check_exits <code> <output>: the stubbed check prints <output> (printf format) and ends with <code>.
check_exits() {
  CHECK_RC=$1 CHECK_OUT=$2
  # shellcheck disable=SC2329,SC2016 # called by loop_check_start; $1 and $2 are the inner bash's
  loop_update_cmd() { LOOP_CMD=(bash -c 'printf "$1"; exit "$2"' check "$CHECK_OUT" "$CHECK_RC"); }
}

# check_run: start the check and wait for it, in one shell (wait needs its own child).
check_run() {
  loop_check_start
  loop_check_wait
}

@test "exit 2: the run stops with exit 2 and the check's report (after its last 'bad config:')" {
  check_exits 2 'update: iteration 1\nbad input:\nold\nbad config:\ntemplate=x is wrong; use smollm2\nsecond\n'
  run -2 --separate-stderr check_run
  [ "$stderr" = "[baton] update-check: started (log: $CHECK_LOG)
[baton] error: the update would reject this configuration (checked in the train environment before any rollout; log: $CHECK_LOG):
template=x is wrong; use smollm2
second" ]
  [ ! -e "$LOOP_RUN_DIR/pids/update-check.pgid" ]
}

@test "exit 0 goes on; another exit stops the run with exit 1 and the log's last lines" {
  check_exits 0 'fine\n'
  run -0 --separate-stderr check_run
  [[ $stderr == *"update-check: the update configuration is accepted ("*"s)" ]]
  check_exits 1 'Traceback\nImportError: no torch\n'
  run -1 --separate-stderr check_run
  [[ $stderr == *"ImportError: no torch"$'\n'"[baton] error: the check of the update configuration failed (exit 1; last lines of $CHECK_LOG above)" ]]
  [ "$(cat "$CHECK_LOG")" = $'Traceback\nImportError: no torch' ] # this run's output only
}

@test "a rollout run checks nothing; loop_check_problems without a report shows the last 15 lines" {
  check_exits 2 'x\n'
  RUN_PHASE=rollout run -0 --separate-stderr check_run
  [ -z "$stderr" ]
  [ ! -e "$CHECK_LOG" ]
  LOOP_CHECK_LOG="$BATS_TEST_TMPDIR/plain.log"
  seq 1 20 >"$LOOP_CHECK_LOG"
  run -0 loop_check_problems
  [ "$output" = "$(seq 6 20)" ]
}

@test "a check past BATON_CHECK_TIMEOUT_S is stopped: exit 1 naming the deadline, its group gone" {
  LOOP_CHECK_S=3
  # shellcheck disable=SC2329 # called by loop_check_start
  loop_update_cmd() { LOOP_CMD=(sleep 299.7); }
  run -1 --separate-stderr check_run
  [[ $stderr == *"error: the check of the update configuration did not finish within 3s (BATON_CHECK_TIMEOUT_S); stopped it. Its log: $CHECK_LOG" ]]
  [ ! -e "$LOOP_RUN_DIR/pids/update-check.pgid" ]
  run -1 pgrep -xf 'sleep 299.7'
}

@test "a check that passed is not run again with the same key; another command, or a failure, runs it" {
  check_exits 0 'first\n'
  run -0 --separate-stderr check_run
  [[ $stderr == *"update-check: started"* ]] && [ "$(cat "$CHECK_LOG")" = first ]
  check_exits 0 'second\n' # (the stub's output is part of its command: another command)
  run -0 --separate-stderr check_run
  [[ $stderr == *"update-check: started"* ]] && [ "$(cat "$CHECK_LOG")" = second ]
  run -0 --separate-stderr check_run # the same command again: skipped, its log kept
  [ "$stderr" = "[baton] update-check: passed before with this command, environment and code; not run again" ]
  [ "$(cat "$CHECK_LOG")" = second ]
  check_exits 2 'bad config:\nx\n'
  run -2 --separate-stderr check_run
  check_exits 2 'bad config:\nx\n' # a rejection is never remembered: it runs (and rejects) again
  run -2 --separate-stderr check_run
  [[ $stderr == *"update-check: started"* ]]
}
