#!/usr/bin/env bats
# loop.sh's loop_rollout_run: a rollout whose policy server stopped answering (exit 75) gets
# vLLM restarted and is resumed; a stuck one (exit 124, its deadline) is resumed, with vLLM
# restarted only when it does not answer; other exits are the rollout's own. The rollout, vLLM's stop
# and start are stubbed (this is the logic around them); the e2e tests run the real ones.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_DEBUG=0 RUN_NUM_NODES=1 RUN_RANK=0
  LOOP_RUN_DIR="$RUN_LOG/run/rank_0" LOOP_POLICY_DOWN=75 LOOP_POLICY_RESTARTS=3
  EVENTS="$BATS_TEST_TMPDIR/events"
  mkdir -p "$LOOP_RUN_DIR/logs"
  # shellcheck disable=SC2329 # the stubs are called by loop_rollout_run
  {
    loop_rollout_cmd() { LOOP_CMD=(rollout "resume=$3"); }
    vllm_stop() { echo "vllm_stop" >>"$EVENTS"; }
    loop_ensure_vllm() { echo "vllm_start" >>"$EVENTS"; }
    loop_run() {
      echo "${*:3}" >>"$EVENTS"
      local rc=${EXITS[0]}
      EXITS=("${EXITS[@]:1}")
      return "$rc"
    }
  }
  LOOP_CMD=(rollout resume=0)
}

@test "the policy server died under the rollout: vLLM restarts and the rollout resumes" {
  EXITS=(75 75 0)
  run -0 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'rollout resume=0' vllm_stop vllm_start 'rollout resume=1' \
    vllm_stop vllm_start 'rollout resume=1')" ]
  [[ $stderr == *"the policy server stopped answering during the train rollout; restarting vLLM and resuming (restart 2 of 3)"* ]]
}

@test "a server that keeps dying: after LOOP_POLICY_RESTARTS restarts the rollout fails with its exit code" {
  EXITS=(75 75 75 75 0)
  run -75 --separate-stderr loop_rollout_run train 1
  [ "$(grep -c '^rollout' "$EVENTS")" -eq 4 ] && [ "$(grep -c vllm_start "$EVENTS")" -eq 3 ]
}

@test "debug mode: the external server is not ours to restart" {
  RUN_DEBUG=1 EXITS=(75 0)
  run -75 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "rollout resume=0" ]
}

@test "another failure is the rollout's own: no restart" {
  EXITS=(1 0)
  run -1 --separate-stderr loop_rollout_run test 2
  [ "$(cat "$EVENTS")" = "rollout resume=0" ]
}

@test "a stuck rollout while the policy server answers: resumed, vLLM left alone" {
  EXITS=(124 0)
  # shellcheck disable=SC2329
  loop_policy_answers() { return 0; }
  run -0 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'rollout resume=0' 'rollout resume=1')" ]
  [[ $stderr == *"the train rollout was stuck while the policy server answers; resuming it (restart 1 of 3)"* ]]
}

@test "a stuck rollout while the policy server does not answer (a hung vLLM): vLLM restarted, rollout resumed" {
  EXITS=(124 0)
  # shellcheck disable=SC2329
  loop_policy_answers() { return 1; }
  run -0 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'rollout resume=0' vllm_stop vllm_start 'rollout resume=1')" ]
}

@test "exit 2 with our server not answering is a dead server (restart, resume); with it answering, bad input" {
  EXITS=(2 0)
  # shellcheck disable=SC2329
  loop_policy_answers() { return 1; }
  run -0 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'rollout resume=0' vllm_stop vllm_start 'rollout resume=1')" ]
  [[ $stderr == *"the train rollout found the policy server unreachable at its start: it died meanwhile"* ]]
  rm "$EVENTS"
  EXITS=(2 0)
  # shellcheck disable=SC2329
  loop_policy_answers() { return 0; }
  run -2 --separate-stderr loop_rollout_run train 1
  [ "$(cat "$EVENTS")" = "rollout resume=0" ]
}
