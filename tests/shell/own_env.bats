#!/usr/bin/env bats
# An environment of the user's own through run.sh (issue 41): docs/examples/my_envs copied to a folder outside
# the repository and loaded by env_config.python_path or by PYTHONPATH. --dry-run composes, builds the
# environment and checks its tasks as a real run does before anything starts (no vLLM); what it refuses exits 2
# with nothing written. In-process: tests/unit/rollout_engine/test_own_env.py; more refusals: bad_input_corpus.

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  load bad_input
  fake_data_setup
  source "$ROOT/scripts/lib/envs.sh"
  unset PYTHONPATH BATON_NODE_FILE
  MINE="$BATS_TEST_TMPDIR/elsewhere/my_envs"
  mkdir -p "${MINE%/*}"
  cp -r "$ROOT/docs/examples/my_envs" "$MINE"
  (cd "$MINE" && "$(envs_python app)" -m my_envs.tasks "$DATA/guess" --train 12 --test 6 >/dev/null)
  # --debug-mode (an external server): the dry run skips vLLM's parser of a server's command line (an import of
  # vLLM, about 10 s a run), which is not what these tests are about
  RUN=(bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout --dry-run --debug-mode)
  GUESS=(env=custom env._target_=my_envs.guess.GuessNumberEnv env_config.train_tasks=guess/train.jsonl
    env_config.test_tasks=guess/test.jsonl)
}

@test "env_config.python_path: --dry-run builds an environment from a folder outside the repository, checks its tasks" {
  run -0 "${RUN[@]}" --rollout-split train-only "${GUESS[@]}" "env_config.python_path=[$MINE]" +env.max_guesses=6
  [[ $output == *"[train rollout] env PYTHONPATH=$ROOT "*" -m rollout_engine --config-name rollout_train "*" env=custom env._target_=my_envs.guess.GuessNumberEnv env_config.train_tasks=guess/train.jsonl env_config.test_tasks=guess/test.jsonl env_config.python_path=\\[$MINE\\] +env.max_guesses=6"* ]]
  run -0 "${RUN[@]}" --rollout-split eval-only "${GUESS[@]}" "env_config.python_path=[$MINE]"
  [[ $output == *"[eval rollout] "*" --config-name rollout_test "*" env._target_=my_envs.guess.GuessNumberEnv "* ]]
  [ ! -e "$LOG" ]
}

@test "PYTHONPATH: the user's folders follow the repository on every child's PYTHONPATH" {
  PYTHONPATH="$MINE:/opt/other::$ROOT" run -0 "${RUN[@]}" --rollout-split train-only "${GUESS[@]}"
  [[ $output == *"[train rollout] env PYTHONPATH=$ROOT:$MINE:/opt/other "* ]]
  [ ! -e "$LOG" ]
}

@test "without the folder, a class that is no Env, a missing folder, a task it refuses: exit 2, nothing written" {
  expect_bad "[baton] error: rollout_train: env._target_ cannot be imported (got 'my_envs.guess.GuessNumberEnv': no module named 'my_envs'); put the folder that holds its package in env_config.python_path=[/abs/folder] (or on PYTHONPATH), or install the package into the app environment" \
    "${RUN[@]}" --rollout-split train-only "${GUESS[@]}"
  expect_bad "env._target_ must name a class deriving from rollout_engine.envs.base.Env (got 'my_envs.guess.GuessState', a class that does not)" \
    "${RUN[@]}" --rollout-split train-only "${GUESS[@]}" env._target_=my_envs.guess.GuessState "env_config.python_path=[$MINE]"
  expect_bad "env_config.python_path[0] is not a folder (got '$BATS_TEST_TMPDIR/nowhere'); give the folder that holds your environment's package" \
    "${RUN[@]}" --rollout-split train-only "${GUESS[@]}" "env_config.python_path=[$BATS_TEST_TMPDIR/nowhere]"
  printf '{"task_id": "g-bad", "task_name": "?", "metadata": {"low": 1, "high": 8, "secret": 9}}\n' >>"$DATA/guess/test.jsonl"
  expect_bad "task file $DATA/guess/test.jsonl: task 'g-bad': guess tasks need whole numbers metadata.low <= secret <= high (got 1, 9, 8)" \
    "${RUN[@]}" --rollout-split eval-only "${GUESS[@]}" "env_config.python_path=[$MINE]"
}
