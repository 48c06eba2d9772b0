# Sourced by the run.sh bats files (bats `load`): ROOT, LOG, and a data path
# whose model folder has only config.json (the default model's shape: enough
# for run.sh's checks and the KV-cache size), an empty tokenizer.json and a chat
# template (what run.sh checks a model folder holds); these tests start no real
# vLLM and no training: fake_pythons_setup gives run.sh stand-ins for both.
# shellcheck shell=bash disable=SC2034 # ROOT, LOG, DATA, CALLS, VLLM_PID_FILE are for the test files

fake_data_setup() {
  local var
  for var in $(compgen -e SLURM); do unset "$var"; done # outside any Slurm step (tests/shell/slurm.bats)
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  LOG="$BATS_TEST_TMPDIR/log"
  DATA="$BATS_TEST_TMPDIR/data"
  mkdir -p "$DATA/models/SmolLM2-135M-Instruct"
  printf '{"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/config.json"
  printf '{}\n' >"$DATA/models/SmolLM2-135M-Instruct/tokenizer.json"
  printf '{"chat_template": "{%% for m in messages %%}{{ m.content }}{%% endfor %%}"}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/tokenizer_config.json"
}

# fake_tasks: task files where run.sh looks for the default ones (tasks/train.jsonl, tasks/test.jsonl), two
# reasoning_gym tasks each (run.sh checks them before anything starts: a run that rolls out needs them).
fake_tasks() {
  mkdir -p "$DATA/tasks"
  local split n
  for split in train test; do
    for n in 1 2; do
      printf '{"task_id": "%s-%s", "task_name": "%s + 1 =", "env": "reasoning_gym", "metadata": {"dataset": ' \
        "$split" "$n" "$n"
      printf '"chain_sum", "entry": {"question": "%s + 1 =", "answer": "%s", "metadata": {}}}}\n' "$n" "$((n + 1))"
    done >"$DATA/tasks/$split.jsonl"
  done
}

# fake_pythons_setup: the train and serve environments' interpreters become
# fakes (a node file of one rank, BATON_NODE_FILE): the train one records each
# command in $CALLS and answers phase=check with exit $FAKE_CHECK_EXIT (default
# 0; 2 with a report as python -m training writes it), anything else with exit
# $FAKE_UPDATE_EXIT (default 1; 2 with a report, as a training the trainer refused);
# the serve one runs fake_vllm.py on vLLM's port (a free one, BATON_VLLM_PORT), name and model, its pid in
# $VLLM_PID_FILE (and accepts every command line the dry run has vLLM's parser check: coordinator/vllm_argcheck.py).
# Updates run in fresh processes (BATON_WARM_TRAINER=0). fake_pythons_setup <ranks>: the fakes on those node
# ranks (default 0; e.g. 0-1 for runs of two nodes, each of which reads the node file).
fake_pythons_setup() {
  local bin="$BATS_TEST_TMPDIR/bin" ranks=${1:-0}
  CALLS="$BATS_TEST_TMPDIR/train-calls" VLLM_PID_FILE="$BATS_TEST_TMPDIR/vllm.pid"
  mkdir -p "$bin"
  cat >"$bin/train-python" <<SH
#!/usr/bin/env bash
printf '%s\n' "\$*" >>"$CALLS"
if [[ " \$* " != *" phase=check "* ]]; then
  if [[ \${FAKE_UPDATE_EXIT:-1} == 2 ]]; then
    printf 'update: phase all\nbad input:\nalgorithm.learning_rate=-1.0 is refused; set it > 0\n'
  fi
  exit "\${FAKE_UPDATE_EXIT:-1}"
fi
if [[ \${FAKE_CHECK_EXIT:-0} == 2 ]]; then
  printf 'update: phase check\nbad config:\nalgorithm.x=1 is wrong; set it to 2\nand a second problem\n'
fi
exit "\${FAKE_CHECK_EXIT:-0}"
SH
  cat >"$bin/serve-python" <<SH
#!/usr/bin/env bash
[[ \${2:-} == */vllm_argcheck.py ]] && exit 0
declare -A arg=()
while ((\$#)); do
  case \$1 in --port | --served-model-name | --model) arg[\$1]=\$2 && shift ;; esac
  shift
done
printf '%s\n' "\$\$" >"$VLLM_PID_FILE"
exec "\$BATON_APP_PY" "$BATS_TEST_DIRNAME/fake_vllm.py" --port "\${arg[--port]}" \\
  --served-model-name "\${arg[--served-model-name]}" --model "\${arg[--model]}"
SH
  chmod +x "$bin/train-python" "$bin/serve-python"
  printf 'node_groups: [{label: fakes, node_ranks: "%s", python: {train: %s, serve: %s}}]\n' \
    "$ranks" "$bin/train-python" "$bin/serve-python" >"$BATS_TEST_TMPDIR/fakes.yaml"
  export BATON_NODE_FILE="$BATS_TEST_TMPDIR/fakes.yaml"
  # a port of its own: scripts/test.sh runs the bats files in parallel, and a server on the port that this
  # run did not start is refused (coordinator/driver/vllm.py)
  BATON_VLLM_PORT=${BATON_VLLM_PORT:-$("${BATON_APP_PY:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  export BATON_VLLM_PORT
  # each update a fresh `python -m training` (the fake); the warm trainer's are tests/unit/driver/test_trainer.py
  export BATON_WARM_TRAINER=0
}
