#!/usr/bin/env bats
# The bad-input corpus of run.sh's own flags and of what run.sh validates
# through Python (issue 11): each case exits 2 with exactly one error naming the
# flag, the value and the fix, and writes nothing (the log path stays absent).
# The Python-validated surfaces are in tests/unit/test_bad_input_corpus.py;
# tests/shell/run_cli.bats covers the argument table's other rules.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  DATA="$BATS_TEST_TMPDIR/data"
  LOG="$BATS_TEST_TMPDIR/log"
  mkdir -p "$DATA"
  unset RANK NODE_RANK BATON_VLLM_DTYPE BATON_NODE_FILE BATON_NODE_ADDR BATON_ROLLOUT_STALL_S BATON_CHECK_TIMEOUT_S \
    BATON_VLLM_START_S BATON_POLICY_RESTARTS VLLM_MAX_MODEL_LEN VLLM_GPU_MEMORY_UTILIZATION VLLM_CPU_OMP_THREADS_BIND \
    VLLM_CPU_SIM_MULTI_NUMA CPU_VISIBLE_MEMORY_NODES
  local var
  for var in $(compgen -e SLURM); do unset "$var"; done
}

# bad <flag or field> <value> <args...>: run.sh exits 2 with one error naming both and a fix, writing nothing.
bad() {
  local field=$1 value=$2
  shift 2
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "$@"
  local errors
  errors=$(grep -c '^\[baton\] error: ' <<<"$stderr" || true)
  [[ $errors == 1 && $stderr == *"$field"* && $stderr == *"$value"* ]] || {
    printf 'errors: %s\nstderr: %s\n' "$errors" "$stderr" >&2
    return 1
  }
  grep -qE "must |use |give |omit |drop |unset |set |pass |choose|e\.g\.|one of" <<<"$stderr"
  [ -z "$output" ]
  [ ! -e "$LOG" ]
}

# bad_over_log <args...>: run.sh exits 2 with one error and nothing on stdout, the existing log path exactly as it
# was ($stderr is the caller's to check).
bad_over_log() {
  local before
  before=$(cd "$LOG" && find . -printf '%p %s %T@\n' | sort)
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "$@"
  [ "$(grep -c '^\[baton\] error: ' <<<"$stderr")" = 1 ] && [ -z "$output" ]
  [ "$(cd "$LOG" && find . -printf '%p %s %T@\n' | sort)" = "$before" ]
}

# model: a small model folder where run.sh looks for the default one (so that compose gets to the overrides)
model() {
  mkdir -p "$DATA/models/SmolLM2-135M-Instruct"
  printf '{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/config.json"
  printf '{}\n' >"$DATA/models/SmolLM2-135M-Instruct/tokenizer.json"
  printf '{"chat_template": "{%% for m in messages %%}{{ m.content }}{%% endfor %%}"}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/tokenizer_config.json"
}

# mine: docs/examples/my_envs copied outside the repository ($MINE, the folder env_config.python_path names), a
# model folder, and a train task file of its tasks where run.sh looks for it
mine() {
  model
  MINE="$BATS_TEST_TMPDIR/elsewhere/my_envs"
  mkdir -p "${MINE%/*}" "$DATA/tasks"
  cp -r "$ROOT/docs/examples/my_envs" "$MINE"
  printf '{"task_id": "g1", "task_name": "Guess", "metadata": {"low": 1, "high": 8, "secret": 3}}\n' \
    >"$DATA/tasks/train.jsonl"
}

@test "cli: --rl-phase in capitals" { bad --rl-phase ROLLOUT --rl-phase ROLLOUT; }
@test "cli: --rollout-split train (not train-only)" { bad --rollout-split train --rl-phase rollout --rollout-split train; }
@test "cli: --eval-interval a fraction" { bad --eval-interval 1.5 --rl-phase both --eval-interval 1.5; }
@test "cli: --num-nodes a word" { bad --num-nodes x --rl-phase update --num-nodes x; }
@test "cli: --num-nodes negative" { bad --num-nodes -1 --rl-phase update --num-nodes -1; }
@test "cli: --max-iterations a word" { bad --max-iterations x --rl-phase update --max-iterations x; }
@test "cli: --max-update-failures zero" { bad --max-update-failures "'0'" --rl-phase update --max-update-failures 0; }
@test "cli: --wait-timeout negative" { bad --wait-timeout -5 --rl-phase update --wait-timeout -5; }
@test "cli: --rank-weights words" { bad --rank-weights a,b --rl-phase update --num-nodes 2 --rank-weights a,b --master; }
@test "cli: --worker a word" { bad --worker "'x'" --rl-phase update --num-nodes 2 --rank-weights 1,1 --worker x; }
@test "cli: --on-rank-failure retry" { bad --on-rank-failure retry --rl-phase update --on-rank-failure retry; }
@test "cli: --node-addr with a bang" { bad --node-addr 'host!' --rl-phase update --node-addr 'host!'; }
@test "cli: --dashboard-port with a letter" { bad --dashboard-port 8o80 --rl-phase update --dashboard-port 8o80; }
@test "cli: --keep-best-margin negative" { bad --keep-best-margin -1 --rl-phase both --eval-interval 1 --keep-best --keep-best-margin -1; }
@test "cli: --keep-best-margin over 100" { bad --keep-best-margin 150 --rl-phase both --eval-interval 1 --keep-best --keep-best-margin 150; }
@test "cli: --keep-best-margin in percent" { bad --keep-best-margin 2% --rl-phase both --eval-interval 1 --keep-best --keep-best-margin 2%; }
@test "cli: --keep-best-margin without --keep-best" { bad --keep-best-margin 2 --rl-phase both --eval-interval 1 --keep-best-margin 2; }
@test "cli: --keep-best with --rl-phase update" { bad --keep-best update --rl-phase update --keep-best; }
@test "cli: --keep-best with --debug-mode" { bad --keep-best --debug-mode --rl-phase both --eval-interval 1 --keep-best --debug-mode; }
@test "cli: --node-file given twice" { bad --node-file /b --rl-phase update --node-file /a --node-file /b; }
@test "cli: --log-path relative with .." { bad --log-path ../exp --log-path ../exp --rl-phase update; }
@test "cli: --log-path equal to --data-path" { bad --log-path "$DATA" --log-path "$DATA" --rl-phase update; }
@test "cli: BATON_VLLM_DTYPE int8" { BATON_VLLM_DTYPE=int8 bad BATON_VLLM_DTYPE int8 --rl-phase update; }
@test "cli: BATON_ROLLOUT_STALL_S in minutes" { BATON_ROLLOUT_STALL_S=15m bad BATON_ROLLOUT_STALL_S 15m --rl-phase update; }
@test "cli: BATON_CHECK_TIMEOUT_S zero" { BATON_CHECK_TIMEOUT_S=0 bad BATON_CHECK_TIMEOUT_S "'0'" --rl-phase update; }
@test "cli: BATON_VLLM_START_S negative" { BATON_VLLM_START_S=-1 bad BATON_VLLM_START_S -1 --rl-phase update; }
@test "cli: BATON_POLICY_RESTARTS a fraction" { BATON_POLICY_RESTARTS=1.5 bad BATON_POLICY_RESTARTS 1.5 --rl-phase update; }
@test "cli: VLLM_MAX_MODEL_LEN, a removed variable" {
  VLLM_MAX_MODEL_LEN=4096 bad VLLM_MAX_MODEL_LEN vllm_config.max_model_len --rl-phase update
}
@test "cli: VLLM_GPU_MEMORY_UTILIZATION, a removed variable" {
  VLLM_GPU_MEMORY_UTILIZATION=0.9 bad VLLM_GPU_MEMORY_UTILIZATION vllm_config.gpu_memory_utilization --rl-phase update
}
@test "cli: --stop with --dry-run and no run" { bad --stop "$LOG" --rl-phase update --dry-run --stop; }
@test "run.sh: no model folder under --data-path" { bad model_path "$DATA/models" --rl-phase update --dry-run; }
@test "run.sh: a real run with algorithm.learning_rate=-1 exits 2 before vLLM starts" {
  model
  load fake_data
  fake_pythons_setup # a vLLM started (it must not be) leaves its pid in $VLLM_PID_FILE
  bad algorithm.learning_rate -1 --rl-phase both --eval-interval 1 --max-iterations 1 algorithm.learning_rate=-1
  [ ! -e "$VLLM_PID_FILE" ] && [ ! -e "$CALLS" ]
}
@test "run.sh: --dry-run refuses model_config.template=no_such_template as the real run's update-check does (train environment)" {
  model
  export TMPDIR=$BATS_TEST_TMPDIR # the dry run's check log, kept on a refusal
  bad "model_config.template='no_such_template' is not a LLaMA-Factory template" no_such_template --rl-phase update \
    --dry-run model_config.template=no_such_template
  [[ $stderr == *"[baton] error: the update would reject this configuration (checked in the train environment"* ]]
}
@test "run.sh: a real run with a task file that is not UTF-8 exits 2 naming the file and line, before vLLM starts" {
  model
  load fake_data
  fake_pythons_setup
  mkdir -p "$DATA/tasks"
  printf '{"task_id": "t1", "task_name": "1 + 1 =", "metadata": {"dataset": "chain_sum", "entry": {"question": "?"}}}\n' \
    >"$DATA/tasks/test.jsonl"
  cp "$DATA/tasks/test.jsonl" "$DATA/tasks/train.jsonl"
  printf '{"task_id": "t2", "task_name": "caf\xe9"}\n' >>"$DATA/tasks/train.jsonl" # latin-1, not UTF-8
  bad "$DATA/tasks/train.jsonl:2" "is not UTF-8 text" --rl-phase both --eval-interval 1 --max-iterations 1
  [ ! -e "$VLLM_PID_FILE" ] && [ ! -e "$CALLS" ]
}
@test "run.sh: --dry-run of a rollout refuses duplicate task ids naming the file and line" {
  model
  mkdir -p "$DATA/tasks"
  printf '{"task_id": "t1", "task_name": "a"}\n{"task_id": "t1", "task_name": "b"}\n' >"$DATA/tasks/train.jsonl"
  bad "$DATA/tasks/train.jsonl:2" "repeats task_id 't1'" --rl-phase rollout --rollout-split train-only --dry-run
}
@test "run.sh: override env_config.server_size=0" { model && bad env_config.server_size 0 --rl-phase update --dry-run env_config.server_size=0; }
@test "run.sh: --node-file with vllm_port 70000" {
  model
  printf 'node_groups: [{node_ranks: 0, vllm_port: 70000}]\n' >"$BATS_TEST_TMPDIR/nodes.yaml"
  bad vllm_port 70000 --rl-phase update --dry-run --node-file "$BATS_TEST_TMPDIR/nodes.yaml"
}
@test "run.sh: --resume over a journal line that is no trajectory exits 2 naming file and line, the log path untouched" {
  model
  local folder="$LOG/trajectories/train/iter_0001"
  mkdir -p "$LOG/run/state/iter_0001" "$folder"
  printf '{"a": 1}\n' >"$folder/rank_0.jsonl"
  bad_over_log --rl-phase update --resume --dry-run
  [[ $stderr == *"[baton] error: --resume: the journal $folder/rank_0.jsonl:1 is not a baton.trajectory/1 line"* ]]
  [[ $stderr == *"move the file aside (its episodes run again) and rerun with --resume"* ]]
}
# the model model_config names (coordinator/model.py; docs/models.md)
@test "run.sh: model_config.model naming no folder and no Hub id" {
  bad model_config.model /no/such/model --rl-phase update --dry-run model_config.model=/no/such/model
}
@test "run.sh: model_config.model and model_config.model_type both set" {
  model
  bad model_config.model_type qwen3-think --rl-phase update --dry-run model_config.model=models/SmolLM2-135M-Instruct \
    model_config.model_type=qwen3-think
}
@test "run.sh: a model folder without tokenizer files, and one without a chat template" {
  model
  rm "$DATA/models/SmolLM2-135M-Instruct/tokenizer.json"
  bad model_config.model "no tokenizer files" --rl-phase update --dry-run
  model
  printf '{}\n' >"$DATA/models/SmolLM2-135M-Instruct/tokenizer_config.json"
  bad model_config.model "no chat template" --rl-phase update --dry-run
}
@test "run.sh: a vision-language model of a family Baton sends no images to" {
  model
  printf '{"model_type": "llava", "vision_config": {"depth": 2}, "text_config": {"num_hidden_layers": 2}}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/config.json"
  bad llava "vision-language model of a family" --rl-phase rollout --rollout-split eval-only --dry-run
}
@test "run.sh: screenshots shown to a text model" {
  model
  mkdir -p "$DATA/tasks"
  printf '{"task_id": "a", "task_name": "a", "metadata": {"miniwob_task": "click-test", "seed": 1}}\n' \
    >"$DATA/tasks/test.jsonl"
  bad env.observation=screenshot "is a text model" --rl-phase rollout --rollout-split eval-only --dry-run env=miniwob \
    env.observation=screenshot
}
@test "run.sh: +policy_config.chat_template_kwargs.enable_thinking=false, a key nothing reads, names the one that is read" {
  model
  bad policy_config.chat_template_kwargs "+model_config.chat_template_kwargs.enable_thinking" --rl-phase update \
    --dry-run +policy_config.chat_template_kwargs.enable_thinking=false
}
@test "run.sh: a start whose model differs from the one the log path recorded exits 2 naming both, nothing written" {
  model
  mkdir -p "$LOG"
  printf '{"wanted": "Qwen/Qwen3-8B", "path": "/hub/Qwen3-8B", "identity": "0123", "chat_template_kwargs": {}, "reasoning": "think", "max_model_len": 2048}\n' \
    >"$LOG/model.json"
  bad_over_log --rl-phase update --resume --dry-run
  [[ $stderr == *"[baton] error: this node would serve and train (the shipped model) ($DATA/models/SmolLM2-135M-Instruct), reasoning none,"* ]]
  [[ $stderr == *"but this log path's model is Qwen/Qwen3-8B (/hub/Qwen3-8B), reasoning think ($LOG/model.json)"* ]]
}
@test "run.sh: --dry-run of an env._target_ that cannot be imported (its folder not given) exits 2" {
  mine
  bad env._target_ "no module named 'my_envs'" --rl-phase rollout --rollout-split train-only --dry-run env=custom \
    env._target_=my_envs.guess.GuessNumberEnv
}
@test "run.sh: --dry-run of an env._target_ that is no Env subclass exits 2" {
  mine
  bad env._target_ "'my_envs.guess.GuessState', a class that does not" --rl-phase rollout --rollout-split train-only \
    --dry-run env=custom env._target_=my_envs.guess.GuessState "env_config.python_path=[$MINE]"
}
@test "run.sh: --dry-run with env_config.python_path naming no folder exits 2" {
  mine
  bad "env_config.python_path[0]" "$BATS_TEST_TMPDIR/nowhere" --rl-phase rollout --rollout-split train-only --dry-run \
    env=custom env._target_=my_envs.guess.GuessNumberEnv "env_config.python_path=[$BATS_TEST_TMPDIR/nowhere]"
}
@test "run.sh: env=custom without env._target_ exits 2" {
  mine
  bad env._target_ "(got nothing)" --rl-phase rollout --rollout-split train-only --dry-run env=custom
}
@test "run.sh: override vllm_config.extra_args setting --max-model-len" {
  model && bad vllm_config.extra_args --max-model-len --rl-phase update --dry-run 'vllm_config.extra_args=[--max-model-len,4096]'
}
@test "run.sh: --node-file with vllm_config.tensor_parallel_size 0" {
  model
  printf 'node_groups: [{node_ranks: 0, vllm_config: {tensor_parallel_size: 0}}]\n' >"$BATS_TEST_TMPDIR/nodes.yaml"
  bad vllm_config.tensor_parallel_size 0 --rl-phase update --dry-run --node-file "$BATS_TEST_TMPDIR/nodes.yaml"
}
@test "run.sh: --dry-run refuses policy_config.max_new_tokens=8192 in the node's auto 2048-token context" {
  model
  load fake_data
  fake_tasks
  bad policy_config.max_new_tokens 8192 --rl-phase rollout --rollout-split train-only --dry-run \
    policy_config.max_new_tokens=8192
  [[ $stderr == *"vllm_config.max_model_len"*"(got 8192 of 2048, auto: "* ]]
}
@test "run.sh: --dry-run refuses more vLLM workers than the node has (vllm_config.tensor_parallel_size=1000)" {
  model
  load fake_data
  fake_tasks
  bad vllm_config.tensor_parallel_size 1000 --rl-phase rollout --rollout-split train-only --dry-run \
    vllm_config.tensor_parallel_size=1000
}
@test "run.sh: --dry-run refuses vllm_config.extra_args that vLLM's parser refuses (serve environment)" {
  model
  load fake_data
  fake_tasks
  bad vllm_config.extra_args "unrecognized arguments: --no-such-flag" --rl-phase rollout --rollout-split train-only \
    --dry-run 'vllm_config.extra_args=[--no-such-flag]'
  [[ $stderr == *"[baton] error: vLLM's parser refuses the server's command line: "* ]]
}
