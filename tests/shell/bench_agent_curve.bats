#!/usr/bin/env bats
# bench/agent_curve.sh's command line: a bad value exits 2 with one message naming
# the flag, the value and the fix, before anything is written.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  DATA="$BATS_TEST_TMPDIR/data"
  LOG="$BATS_TEST_TMPDIR/log"
}

load bad_input

# run_bad <expected message part> <args...>: the bench must exit 2, say it, and create neither folder.
run_bad() {
  expect_bad "$1" bash "$ROOT/bench/agent_curve.sh" --data-path "$DATA" --log-path "$LOG" "${@:2}"
  [ ! -e "$DATA" ]
}

@test "--help names every flag and exits 0" {
  run -0 bash "$ROOT/bench/agent_curve.sh" --help
  [[ $output == *"--arm rl|rl-disagree|control|mixed|grpo|both"* && $output == *"--arm-lr LR"* ]]
  [[ $output == *"--arm-lr: the arms' learning rate (default 1e-4; the warm start keeps 1e-4)"* ]]
  [[ $output == *"--arm-set KEY=VALUE (repeatable): an override for the arms only, not the warm start"* ]]
}

@test "each bad value: exit 2, the flag and the value named, nothing written" {
  run_bad "--env is required: miniwob, miniwob-open or textworld"
  run_bad "--env must be miniwob, miniwob-open or textworld (got 'webarena')" --env webarena
  run_bad "--iterations must be a positive integer (got '0')" --env miniwob-open --iterations 0
  run_bad "--arm must be rl, rl-disagree, control, mixed, grpo or both (got 'ppo')" --env miniwob-open --arm ppo
  run_bad "--arm-lr must be a positive learning rate, e.g. 3e-5 (got 'fast')" --env miniwob-open --arm-lr fast
  run_bad "--arm-lr must be a positive learning rate, e.g. 3e-5 (got '0')" --env miniwob-open --arm-lr 0
  run_bad "--seeds must be training seeds separated by commas, e.g. 1,2 (got '1;2')" --env miniwob-open --seeds '1;2'
  run_bad "--arm-lr needs a value" --env miniwob-open --arm-lr
  run_bad "--arm-set must be KEY=VALUE, e.g. algorithm.policy_gradient.old_logprobs=trainer (got 'trainer')" \
    --env miniwob-open --arm-set trainer
}
