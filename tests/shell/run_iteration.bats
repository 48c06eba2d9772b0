#!/usr/bin/env bats
# run.sh --dry-run (the commands each phase would run, the numbering on disk, the eval schedule) and
# override routing (needs the app environment). The state on disk itself: tests/unit/coordinator/test_runstate.py.

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  fake_data_setup
  fake_tasks # a run that rolls out needs task files (run.sh checks them before anything starts)
}

# finished <iteration>: the end marker of <iteration> under $LOG, as the driver writes it (runstate.mark).
finished() {
  mkdir -p "$LOG/run/state/$(printf 'iter_%04d' "$1")"
  date +%s >"$LOG/run/state/$(printf 'iter_%04d' "$1")/iteration.done"
}

@test "--dry-run prints the serve, rollout, eval, update and reload commands and writes nothing" {
  fake_pythons_setup # the dry run runs the update-check: a fake train interpreter answers it
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run env_config.train_tasks_rollout_size=16 algorithm.max_steps=1
  [[ $output == *"# iteration 1, --rl-phase both"* ]]
  # one NUMA node: the uni executor, its engine core forked by coordinator/vllm_serve.py; several: vLLM's own server
  if [[ $(grep -s '^Mems_allowed_list:' /proc/self/status | cut -f 2) =~ ^[0-9]+$ ]]; then
    [[ $output == *"[serve] env VLLM_SERVER_DEV_MODE=1 "*"/coordinator/vllm_serve.py --model $DATA/models/SmolLM2-135M-Instruct"* ]]
  else
    [[ $output == *"[serve] env VLLM_SERVER_DEV_MODE=1 "*"-m vllm.entrypoints.openai.api_server --model $DATA/models/SmolLM2-135M-Instruct"* ]]
  fi
  # the dtype this CPU runs natively; the KV cache holds reasoning_gym's 32 requests of 2048 tokens
  if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    [[ $output == *"VLLM_CPU_KVCACHE_SPACE=2 "*"--dtype bfloat16"* ]]
  else
    [[ $output == *"VLLM_CPU_KVCACHE_SPACE=4 "*"--dtype float32"* ]]
  fi
  [[ $output == *"[train rollout] env PYTHONPATH=$ROOT "*"-m rollout_engine --config-name rollout_train data_path=$DATA log_path=$LOG iteration=1 rank=0 rank_weights="'\[1\]'" "*"env_config.train_tasks_rollout_size=16"* ]]
  [[ $output == *"[eval rollout] "*"--config-name rollout_test "*" rank=0 rank_weights="'\[1\]'" "* ]]
  [[ $output == *"[update] "*"-m training --config-name update log_path=$LOG iteration=1 model_path=$DATA/models/SmolLM2-135M-Instruct phase=all launch.nnodes=1 launch.node_rank=0 launch.master_port="*" algorithm.max_steps=1"* ]]
  [[ $output == *"[serve new policy] POST http://127.0.0.1:"*"/collective_rpc"* ]]
  # overrides reach the configs that have the key: rollout keys not the update, and the reverse
  [[ $(grep '^\[update\]' <<<"$output") != *train_tasks_rollout_size* ]]
  [[ $(grep '^\[train rollout\]' <<<"$output") != *max_steps* ]]
  [ ! -e "$LOG" ]
}

@test "--keep-best --keep-best-margin 2.5: --dry-run prints the decision's command" {
  fake_pythons_setup # the dry run runs the update-check: a fake train interpreter answers it
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --keep-best --keep-best-margin 2.5
  [[ $output == *"[keep-best (after each held-out rollout; a worse policy: python -m training ... phase=revert)] env PYTHONPATH=$ROOT "*"-m coordinator keep-best --log-path $LOG --iteration 1 --margin 2.5 --base-model $DATA/models/SmolLM2-135M-Instruct"* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 --dry-run
  [[ $output != *keep-best* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run prints the dashboard's command" {
  fake_pythons_setup # the dry run runs the update-check: a fake train interpreter answers it
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update --dry-run \
    --dashboard-port 8765
  [[ $output == *"[dashboard (for the whole run)] env PYTHONPATH=$ROOT "*" -m coordinator dashboard --log-path $LOG --port 8765 --host 127.0.0.1"* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run passes this node's rank and the ranks' weights to the rollouts and the update" {
  fake_pythons_setup 0-1 # the fakes answer the update-check and vLLM's parser on both ranks
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 2,1 --worker 1
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" iteration=1 rank=1 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[eval rollout\]' <<<"$output") == *" iteration=1 rank=1 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[update ' <<<"$output") == *" phase=train launch.nnodes=2 launch.node_rank=1 launch.master_addr="*" launch.master_port="* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 2,1 --master
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[update ' <<<"$output") == *" launch.nnodes=2 launch.node_rank=0 "* ]]
  # a single node: its one given weight (the node file names ranks 0-1: none for one node)
  BATON_NODE_FILE="" run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split train-only \
    --dry-run --rank-weights 3
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 rank_weights="'\[3\]'" "* ]]
  # limits_scope=cluster: this node's KV cache holds its share (64 of 128 requests, as in the test below)
  BATON_VLLM_DTYPE=float32 run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout \
    --rollout-split eval-only --dry-run --num-nodes 2 --rank-weights 1,1 --worker 1 \
    env_config.limits_scope=cluster env_config.max_vllm_sessions=128
  [[ $output == *"VLLM_CPU_KVCACHE_SPACE=7 "*"--dtype float32"* ]]
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout \
    --rollout-split eval-only --dry-run --num-nodes 2 --rank-weights 1,1 --master env_config.limits_scope=cluster \
    env_config.server_size=1
  [[ $stderr == *"env_config.server_size must be >= 2 with env_config.limits_scope=cluster (got 1)"*"use env_config.limits_scope=node"* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run: BATON_VLLM_DTYPE forces the dtype and the KV cache follows it and the sessions" {
  fake_pythons_setup # a fake serve interpreter accepts the command line (vLLM's parser: tests below)
  BATON_VLLM_DTYPE=bfloat16 run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase rollout --rollout-split eval-only --dry-run env_config.max_vllm_sessions=64
  [[ $output == *"VLLM_CPU_KVCACHE_SPACE=4 "*"--dtype bfloat16"* ]]
  BATON_VLLM_DTYPE=float32 run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase rollout --rollout-split eval-only --dry-run env_config.max_vllm_sessions=64
  [[ $output == *"VLLM_CPU_KVCACHE_SPACE=7 "*"--dtype float32"* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run follows the numbering on disk and the eval schedule" {
  fake_pythons_setup # the dry run runs the update-check: a fake train interpreter answers it
  mkdir -p "$LOG"
  finished 1
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 2 --dry-run
  [[ $output == *"# iteration 2,"* && $output != *"[eval rollout]"* ]]
  finished 2
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 2 --dry-run
  [[ $output == *"# iteration 3,"* && $output == *"[eval rollout]"* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only --dry-run
  [[ $output == *"[eval rollout]"* && $output != *"[train rollout]"* && $output != *"[update]"* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update --dry-run
  [[ $output == *"[update]"* && $output != *"[serve]"* && $output != *"rollout]"* ]]
}

@test "bad overrides exit 2 naming the override and the fix, before anything is written" {
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    env_config.server_size=0 nosuch.key=1 log_path=/elsewhere
  [[ $stderr == *"override 'nosuch.key=1': no key 'nosuch.key' in the rollout config"* ]]
  [[ $stderr == *"override 'log_path=/elsewhere': log_path is set by run.sh (--log-path); drop the override"* ]]
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    env_config.server_size=0 algorithm.cutoff_len=0
  [[ $stderr == *"env_config.server_size must be >= 1 (got 0)"* ]]
  [[ $stderr == *"algorithm.cutoff_len must be in [1, 1048576] (got 0)"* ]]
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    policy_config.base_url=http://10.0.0.1:8000/v1
  [[ $stderr == *"add --debug-mode to use an external server"* ]]
  [ ! -e "$LOG" ]
}

@test "tracker=: one tracker or a list reaches the update; an unknown one or a bad field exits 2, nothing written" {
  fake_pythons_setup # the dry run runs the update-check: a fake train interpreter answers it
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update --dry-run \
    'tracker=[tensorboard,wandb]' tracker.wandb.mode=online
  [[ $output == *"[update] "*" tracker=\\[tensorboard\\,wandb\\] tracker.wandb.mode=online"* ]]
  unset BATON_NODE_FILE
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both \
    --eval-interval 1 tracker=tensorbord
  [ "$stderr" = "[baton] error: override 'tracker=tensorbord': configs/tracker/ has no 'tensorbord'; choose one of none, tensorboard, wandb" ]
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    tracker=wandb tracker.wandb.mode=onlin
  [[ $stderr == *"tracker.wandb.mode must be offline or online (got 'onlin')"* ]]
  [ ! -e "$LOG" ]
}

@test "--node-file: this rank's variables and port reach its vLLM, other ranks keep the defaults; a bad file exits 2" {
  cat >"$BATS_TEST_TMPDIR/nodes.yaml" <<YAML
node_groups:
  - label: small
    node_ranks: 1
    env_vars: {VLLM_CPU_KVCACHE_SPACE: "3"}
    vllm_port: 18555
    node_addr: 10.1.2.3
YAML
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 1,1 --worker 1 --node-file "$BATS_TEST_TMPDIR/nodes.yaml"
  [[ $output == *"node file $BATS_TEST_TMPDIR/nodes.yaml: rank 1 sets VLLM_CPU_KVCACHE_SPACE BATON_VLLM_PORT BATON_NODE_ADDR"* ]]
  [[ $(grep '^\[serve\]' <<<"$output") == *"VLLM_CPU_KVCACHE_SPACE=3 "*"--port 18555"* ]]
  # (a rollout: the master of a run that trains would run the update-check in the real train environment)
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout \
    --rollout-split train-only --dry-run --num-nodes 2 --rank-weights 1,1 --master --node-file "$BATS_TEST_TMPDIR/nodes.yaml"
  [[ $output != *"node file"* && $(grep '^\[serve\]' <<<"$output") == *"--port 8999"* ]]
  printf 'node_groups: [{node_ranks: 5}]\n' >"$BATS_TEST_TMPDIR/bad.yaml"
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both \
    --eval-interval 1 --num-nodes 2 --rank-weights 1,1 --master --node-file "$BATS_TEST_TMPDIR/bad.yaml"
  [[ $stderr == *"node_groups[0].node_ranks [5] are outside 0..1 (--num-nodes 2)"* ]]
  [ ! -e "$LOG" ]
}

@test "a spread start waits its share before it writes anything; SIGTERM meanwhile ends it with 143, nothing written" {
  local out="$BATS_TEST_TMPDIR/out" pid status=0 waited=0
  mkdir -p "$LOG"
  # rank 1 of 2 over a 600 s spread: 300 s (a multi-node start makes about 12 names a node: docs/multinode.md)
  BATON_START_SPREAD_S=600 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    --num-nodes 2 --rank-weights 1,1 --worker 1 >"$out" 2>&1 &
  pid=$!
  until grep -q "starting in" "$out" || ((waited >= 120)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  [[ $(<"$out") == *"[baton] rank 1 of 2: starting in 300.0s, the nodes' starts spread over 600s"*"(BATON_START_SPREAD_S; docs/multinode.md)"* ]]
  [[ -z $(ls -A "$LOG") ]]
  kill -TERM "$pid"
  wait "$pid" || status=$?
  ((status == 143))
  [[ -z $(ls -A "$LOG") ]]
}
