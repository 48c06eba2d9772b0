#!/usr/bin/env bats
# iteration.sh: the eval schedule, iteration numbers persisted on disk, phase
# markers; run.sh --dry-run and override routing (needs the app environment).

bats_require_minimum_version 1.5.0

setup() {
  load fake_data
  fake_data_setup
  source "$ROOT/scripts/lib/iteration.sh"
}

@test "eval schedule: iteration % N == 1, and N = 1 evaluates every iteration" {
  local n due=""
  for n in 1 2 3 4 5 6 7 8 13; do iteration_eval_due "$n" 6 && due+="$n "; done
  [ "$due" = "1 7 13 " ]
  due=""
  for n in 1 2 3; do iteration_eval_due "$n" 1 && due+="$n "; done
  [ "$due" = "1 2 3 " ]
  due=""
  for n in 1 2 3 4 5; do iteration_eval_due "$n" 2 && due+="$n "; done
  [ "$due" = "1 3 5 " ]
}

@test "iteration numbers persist: a finished iteration is followed by the next, an unfinished one is continued" {
  run -0 iteration_next "$LOG"
  [ "$output" = 1 ]
  iteration_mark "$LOG" 1 train_rollout
  run -0 iteration_next "$LOG"
  [ "$output" = 1 ]
  iteration_mark "$LOG" 1 iteration
  run -0 iteration_next "$LOG"
  [ "$output" = 2 ]
  mkdir -p "$LOG/run/state/iter_0010"
  run -0 iteration_last "$LOG"
  [ "$output" = 10 ]
}

@test "markers: atomic files with content; a restart forgets the phases of an interrupted iteration" {
  iteration_mark "$LOG" 3 update "promoted v2"
  run -0 cat "$LOG/run/state/iter_0003/update.done"
  [ "$output" = "promoted v2" ]
  iteration_is_done "$LOG" 3 update
  run -1 iteration_is_done "$LOG" 3 serve
  iteration_add_time "$LOG" 3 update 12
  run -0 iteration_restart "$LOG" 3
  [[ $output == *"iteration 3 was interrupted; starting it again (pass --resume to continue it)"* ]]
  run -1 iteration_is_done "$LOG" 3 update
  [ ! -e "$LOG/run/state/iter_0003/times" ]
  [ -z "$(ls "$LOG/run/state/iter_0003"/.*.tmp 2>/dev/null)" ]
}

@test "--dry-run prints the serve, rollout, eval, update and reload commands and writes nothing" {
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run env_config.train_tasks_rollout_size=16 algorithm.max_steps=1
  [[ $output == *"# iteration 1, --rl-phase both"* ]]
  [[ $output == *"[serve] env VLLM_SERVER_DEV_MODE=1 "*"-m vllm.entrypoints.openai.api_server --model $DATA/models/SmolLM2-135M-Instruct"* ]]
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
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --keep-best --keep-best-margin 2.5
  [[ $output == *"[keep-best (after each held-out rollout; a worse policy: python -m training ... phase=revert)] env PYTHONPATH=$ROOT "*"-m coordinator keep-best --log-path $LOG --iteration 1 --margin 2.5 --base-model $DATA/models/SmolLM2-135M-Instruct"* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 --dry-run
  [[ $output != *keep-best* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run passes this node's rank and the ranks' weights to the rollouts and the update" {
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 2,1 --worker 1
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" iteration=1 rank=1 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[eval rollout\]' <<<"$output") == *" iteration=1 rank=1 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[update ' <<<"$output") == *" phase=train launch.nnodes=2 launch.node_rank=1 launch.master_addr="*" launch.master_port="* ]]
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 2,1 --master
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 rank_weights="'\[2\,1\]'" "* ]]
  [[ $(grep '^\[update ' <<<"$output") == *" launch.nnodes=2 launch.node_rank=0 "* ]]
  # a single node: its one given weight
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split train-only \
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
  BATON_VLLM_DTYPE=bfloat16 run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase rollout --rollout-split eval-only --dry-run env_config.max_vllm_sessions=64
  [[ $output == *"VLLM_CPU_KVCACHE_SPACE=4 "*"--dtype bfloat16"* ]]
  BATON_VLLM_DTYPE=float32 run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase rollout --rollout-split eval-only --dry-run env_config.max_vllm_sessions=64
  [[ $output == *"VLLM_CPU_KVCACHE_SPACE=7 "*"--dtype float32"* ]]
  [ ! -e "$LOG" ]
}

@test "--dry-run follows the numbering on disk and the eval schedule" {
  mkdir -p "$LOG"
  iteration_mark "$LOG" 1 iteration
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 2 --dry-run
  [[ $output == *"# iteration 2,"* && $output != *"[eval rollout]"* ]]
  iteration_mark "$LOG" 2 iteration
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
  [[ $stderr == *"algorithm.cutoff_len must be >= 1 (got 0)"* ]]
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update \
    policy_config.base_url=http://10.0.0.1:8000/v1
  [[ $stderr == *"add --debug-mode to use an external server"* ]]
  [ ! -e "$LOG" ]
}

@test "tracker=: one tracker or a list reaches the update; an unknown one or a bad field exits 2, nothing written" {
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase update --dry-run \
    'tracker=[tensorboard,wandb]' tracker.wandb.mode=online
  [[ $output == *"[update] "*" tracker=\\[tensorboard\\,wandb\\] tracker.wandb.mode=online"* ]]
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
  run -0 bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 \
    --dry-run --num-nodes 2 --rank-weights 1,1 --master --node-file "$BATS_TEST_TMPDIR/nodes.yaml"
  [[ $output != *"node file"* && $(grep '^\[serve\]' <<<"$output") == *"--port 8999"* ]]
  printf 'node_groups: [{node_ranks: 5}]\n' >"$BATS_TEST_TMPDIR/bad.yaml"
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase both \
    --eval-interval 1 --num-nodes 2 --rank-weights 1,1 --master --node-file "$BATS_TEST_TMPDIR/bad.yaml"
  [[ $stderr == *"node_groups[0].node_ranks [5] are outside 0..1 (--num-nodes 2)"* ]]
  [ ! -e "$LOG" ]
}
