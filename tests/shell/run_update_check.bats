#!/usr/bin/env bats
# run.sh checks the update's configuration in the train environment (python -m
# training phase=check) beside vLLM's start-up and before the first rollout or
# update: a rejection (exit 2) stops the run with exit 2 and the check's report.
# Fakes stand in for the train and serve interpreters (fake_pythons_setup).

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  fake_data_setup
  fake_tasks
  fake_pythons_setup
  source "$ROOT/scripts/lib/envs.sh"
  envs_export
  unset RANK NODE_RANK
}

teardown() {
  # the fake vLLM a failed test may leave, by the pid it recorded: nothing else
  [[ ! -s $VLLM_PID_FILE ]] || kill "$(cat "$VLLM_PID_FILE")" 2>/dev/null || true
}

# line_of <text>: print the number of the first stderr line holding <text> (fails without one).
line_of() {
  grep -n -m1 -F -- "$1" <<<"$stderr" | cut -d: -f1 | grep .
}

@test "a rejected update config stops --rl-phase both with exit 2 and the report, before any rollout; vLLM is stopped" {
  FAKE_CHECK_EXIT=2 run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase both --eval-interval 1 algorithm.max_steps=1
  local log="$LOG/run/rank_0/logs/update-check.log"
  [[ $stderr == *"[baton] error: the update would reject this configuration (checked in the train environment before any rollout; log: $log):"$'\n'"algorithm.x=1 is wrong; set it to 2"$'\n'"and a second problem"* ]]
  # started before vLLM, waited for after it: the check overlaps vLLM's start-up
  (($(line_of "update-check: started") < $(line_of "starting vLLM")))
  (($(line_of "vLLM ready") < $(line_of "error: the update would reject")))
  [[ $stderr != *"rollout-train"* ]]
  [ ! -e "$LOG/trajectories" ]
  [ ! -e "$LOG/run/rank_0/logs/iter_0001.train.log" ]
  # the check ran once, with the update's own overrides; vLLM was stopped by the EXIT trap
  [ "$(wc -l <"$CALLS")" -eq 1 ]
  [[ $(cat "$CALLS") == "-m training --config-name update log_path=$LOG iteration=1 model_path=$DATA/models/SmolLM2-135M-Instruct phase=check "*" algorithm.max_steps=1" ]]
  # both groups forgotten: the node's records (run/rank_0/groups.json) name neither
  [[ $(PYTHONPATH=$ROOT "$BATON_APP_PY" -c 'import sys; from coordinator import groupfile
print(sorted(groupfile.read(sys.argv[1])))' "$LOG/run/rank_0/groups.json") == "[]" ]]
  run ! kill -0 "$(cat "$VLLM_PID_FILE")"
}

@test "--dry-run runs the same check: a rejection exits 2 with the real run's message, before anything is written" {
  export TMPDIR=$BATS_TEST_TMPDIR # the dry run's check log, kept on a refusal
  FAKE_CHECK_EXIT=2 run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase both --eval-interval 1 --dry-run algorithm.max_steps=1
  [ -z "$output" ] && [ ! -e "$LOG" ]
  local dry=$stderr
  FAKE_CHECK_EXIT=2 run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase both --eval-interval 1 algorithm.max_steps=1
  # the same error line and report; only where its log is differs
  local real
  real=$(grep -A3 '^\[baton\] error: ' <<<"$stderr" | sed 's/log: [^)]*)/log: L)/')
  [[ $real == *"algorithm.x=1 is wrong; set it to 2"$'\n'"and a second problem" ]]
  [ "$(grep -A3 '^\[baton\] error: ' <<<"$dry" | sed 's/log: [^)]*)/log: L)/')" = "$real" ]
  # an accepted check: the plan, and the command the real run checks with
  rm -rf "$LOG" "$CALLS"
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase both --eval-interval 1 --dry-run algorithm.max_steps=1
  [[ $output == "# iteration 1, --rl-phase both (dry run: nothing started or written)"* ]]
  [[ $(cat "$CALLS") == "-m training --config-name update log_path=$LOG iteration=1 model_path=$DATA/models/SmolLM2-135M-Instruct phase=check "*" algorithm.max_steps=1" ]]
  [ ! -e "$LOG" ]
  # the refused check's log is kept (its path is in the error), the accepted one's removed
  local kept=("$BATS_TEST_TMPDIR"/baton-dry-run-update-check-*)
  [ "${#kept[@]}" -eq 1 ] && [[ $dry == *"log: ${kept[0]})"* ]]
}

@test "an accepted update config lets the run go on to its first rollout; a run whose last update failed exits 1" {
  # (the fake vLLM answers the fake tasks; the fake training fails with exit 1: a failure a retry may mend)
  run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase both --eval-interval 1 --max-iterations 1
  (($(line_of "update-check: the update configuration is accepted") < $(line_of "rollout-train: started")))
  [[ $stderr == *"iteration 1: update failed (1 in a row); keeping the served policy"* ]]
  # the run did everything it planned but its last update failed: never exit 0 for a policy that was not trained
  [[ $stderr == *"[baton] error: the run ended with its last update failed (iteration 1: see $LOG/run/rank_0/logs/iter_0001.update.log); policy/current is unchanged (the base model)"* ]]
  [[ $stderr != *"run finished"* ]]
  [ -s "$LOG/trajectories/train/iter_0001/rank_0.jsonl" ] # the rollout is kept
  run ! kill -0 "$(cat "$VLLM_PID_FILE")"
}

@test "--rl-phase update: a run whose only update failed exits 1 naming it; the train rollout stays to train on" {
  mkdir -p "$LOG/run/state/iter_0001"
  date +%s >"$LOG/run/state/iter_0001/train_rollout.done" # a train rollout to train on (runstate.mark)
  run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase update --max-iterations 1 --wait-timeout 0
  [[ $stderr == *"iteration 1: update failed (1 in a row)"* ]]
  [[ $stderr == *"[baton] error: the run ended with its last update failed (iteration 1: see "*"iter_0001.update.log); policy/current is unchanged (the base model)"* ]]
  [ "$(cat "$LOG/run/state/iter_0001/update.done")" = "failed (exit 1)" ]
}

@test "--rl-phase update: a rejection exits 2 before the wait for a train rollout; an accepted config waits" {
  FAKE_CHECK_EXIT=2 run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase update --wait-timeout 0
  [[ $stderr == *"error: the update would reject this configuration"*"algorithm.x=1 is wrong; set it to 2"* ]]
  [[ $stderr != *"no train rollout"* ]]
  [ ! -e "$LOG/run/rank_0/owner.update" ]
  run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase update --wait-timeout 0
  [[ $stderr == *"update-check: the update configuration is accepted"*"no train rollout to train on under $LOG"* ]]
  [ ! -e "$VLLM_PID_FILE" ]
}

@test "an update the trainer refuses (exit 2) ends the run with exit 2 and the report: not retried, never exit 0" {
  mkdir -p "$LOG/run/state/iter_0001"
  date +%s >"$LOG/run/state/iter_0001/train_rollout.done" # a train rollout to train on (runstate.mark)
  FAKE_UPDATE_EXIT=2 run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase update --max-iterations 3 --max-update-failures 3 --wait-timeout 0
  [[ $stderr == *"[baton] error: iteration 1: the update rejected its input"*"fix the configuration"*":"$'\n'"algorithm.learning_rate=-1.0 is refused; set it > 0"* ]]
  # the check, then one update: a refusal is not retried
  [ "$(grep -c -v ' phase=check ' "$CALLS")" -eq 1 ]
  [ "$(cat "$LOG/run/state/iter_0001/update.done")" = "failed (exit 2: bad input)" ]
}
