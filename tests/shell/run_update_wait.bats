#!/usr/bin/env bats
# run.sh --rl-phase update with nothing to train on: it waits for a train
# rollout, --wait-timeout bounds the wait, SIGTERM ends the wait (and a worker's
# wait for its master) at once, and two runs of the same role on one log path are refused (needs the app
# environment; no training starts, so the model folder only needs config.json;
# a fake train interpreter accepts the update-check: run_update_check.bats).

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  load hang_bound
  fake_data_setup
  fake_pythons_setup
  unset RANK NODE_RANK
}

teardown() {
  # the background run started by a test, by the pid it recorded: nothing else
  [[ -z ${BG:-} ]] || kill -KILL "$BG" 2>/dev/null || true
}

# wait_for <seconds> <cmd...>: poll until <cmd> succeeds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

@test "with no train rollout, --wait-timeout 0 stops at once: exit 1 naming the log path and what to run" {
  run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    --wait-timeout 0
  # (0 s measured with $SECONDS: 1 when a second boundary passes under load)
  [[ $stderr =~ "no train rollout to train on under $LOG after "[01]"s (--wait-timeout 0)" ]]
  [[ $stderr == *"run --rl-phase rollout --rollout-split train-only"* ]]
  [ ! -e "$LOG/training" ]
  [ ! -e "$LOG/policy" ]
  # the run released its role: the next one may start
  [ ! -e "$LOG/run/rank_0/owner.update" ]
}

@test "the wait polls until --wait-timeout, saying what it waits for" {
  BATON_UPDATE_POLL_S=1 run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase update --wait-timeout 3
  [[ $stderr == *"waiting for a new train rollout under $LOG/trajectories/train"*"checking every 1s"* ]]
  [[ $stderr == *"after 3s (--wait-timeout 3)"* ]]
}

@test "a waiting update stops on SIGTERM (exit 143) and a second update run on the same log path is refused" {
  BATON_UPDATE_POLL_S=600 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    >"$BATS_TEST_TMPDIR/bg.log" 2>&1 &
  BG=$!
  wait_for 60 grep -q "waiting for a new train rollout" "$BATS_TEST_TMPDIR/bg.log"
  read -r _ owner _ <"$LOG/run/rank_0/owner.update"
  [ "$owner" = "$BG" ]

  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    --wait-timeout 0
  [[ $stderr == *"another run.sh (pid $BG) is running the update phase of rank 0 on --log-path $LOG"* ]]
  [[ $stderr == *"kill $BG: it cleans up"* ]]
  [ -e "$LOG/run/rank_0/owner.update" ]

  local kids rc=0
  kids=$(ps -o pid= --ppid "$BG" | tr -d ' ') # (none, usually: the driver waits in-process, not in a sleep child)
  kill -TERM "$BG"
  # SIGTERM ends the wait (in seconds): a wait it did not end would last its 600 s poll
  ends_within 60 "$BG" "run.sh after SIGTERM during its wait for a train rollout"
  wait "$BG" || rc=$?
  [ "$rc" -eq 143 ]
  # no child left, role released
  for pid in $kids; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      return 1
    fi
  done
  [ ! -e "$LOG/run/rank_0/owner.update" ]
  BG=""
}

@test "a worker waiting for its master (minutes at most) stops on SIGTERM at once: exit 143, the join stopped" {
  BATON_JOIN_WAIT_S=600 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    --num-nodes 2 --rank-weights 1,1 --worker 1 >"$BATS_TEST_TMPDIR/bg.log" 2>&1 &
  BG=$!
  wait_for 60 grep -q "rank 1: waiting for the master (rank 0)" "$BATS_TEST_TMPDIR/bg.log"
  local rc=0
  kill -TERM "$BG"
  # SIGTERM ends the join (in seconds): a join it did not end would wait its 600 s
  ends_within 60 "$BG" "run.sh after SIGTERM while the worker waits for its master"
  wait "$BG" || rc=$?
  [ "$rc" -eq 143 ]
  [ ! -e "$LOG/run/rank_1/owner.update" ]
  [ -z "$(find "$LOG/run/rank_1" -name '.join.*')" ]
}
