#!/usr/bin/env bash
# One row per episode against one row per turn on a real multi-turn rollout of the default model:
#
#   bash bench/episode_rows.sh --env textworld|miniwob [--data-path DIR] [--log-path DIR] [-- update overrides]
#
# Rolls out one train iteration (run.sh --rl-phase rollout, the agent benchmark's tasks and episode settings:
# bench/agent_curve.sh), then runs the update on it twice per algorithm (bench/episode_rows.py: per_turn, then
# auto) on the first $BATON_ROWS_EPISODES (24) episodes, relabelled in the benchmark's copy (the cost of training
# them does not depend on the label, and a base model solves few): rft with each a success, grpo with every
# other one a success.
# Prints one JSON line per run: rows, tokens processed, replies trained, trainer runtime, update wall time.
# About 15 minutes an environment on 2 cores. Record the lines with lscpu's model name and flags in
# docs/benchmarks.md ("One row per episode").
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

main() {
  local env="" data="" log=""
  local -a extra=()
  while (($#)); do
    case "$1" in
      --env | --data-path | --log-path)
        [[ $# -ge 2 ]] || common_die 2 "$1 needs a value"
        case "$1" in
          --env) env=$2 ;;
          --data-path) data=$2 ;;
          --log-path) log=$2 ;;
        esac
        shift 2
        ;;
      --) shift && extra=("$@") && break ;;
      *) common_die 2 "unknown argument '$1' (update overrides go after --)" ;;
    esac
  done
  local -a settings
  case "$env" in
    textworld) settings=(env=textworld env.max_steps=6 env_config.server_size=8 policy_config.max_new_tokens=24) ;;
    miniwob) settings=(env=miniwob env.max_steps=5 env_config.server_size=4 policy_config.max_new_tokens=32) ;;
    *) common_die 2 "--env must be textworld or miniwob (got '$env')" ;;
  esac
  data=${data:-$(common_baton_home)/bench-data-rows-$env}
  log=${log:-$(common_baton_home)/bench-logs/rows-$env}
  [[ $env != textworld ]] || settings+=("env.games_dir=$data/textworld/games")
  envs_export
  mkdir -p "$data"
  PYTHONPATH="$ROOT" "$BATON_TRAIN_PY" -m training.default_model --data-path "$data" ||
    common_die 1 "preparing the default model failed (messages above)"
  local bench=$env
  [[ $env != miniwob ]] || bench=miniwob-open
  [[ -s $data/tasks/train.jsonl ]] ||
    PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.agent_curve tasks --env "$bench" --out "$data/tasks"
  if [[ ! -e $log/trajectories/train/iter_0001 ]]; then
    common_log "rolling out one train iteration of $env: $log"
    bash "$ROOT/scripts/run.sh" --data-path "$data" --log-path "$log" --rl-phase rollout --rollout-split train-only \
      --max-iterations 1 "${settings[@]}" env_config.train_tasks_rollout_size=32 env_config.n_samples_per_task=4 \
      env_config.max_vllm_sessions=16 env_config.live_view=plain
  fi
  local model=$data/models/SmolLM2-135M-Instruct
  local -a common=(algorithm.per_device_train_batch_size=2 algorithm.gradient_accumulation_steps=4
    algorithm.cutoff_len=2048 algorithm.num_train_epochs=1 algorithm.warmup_steps=0 "${extra[@]}")
  # the cost of training these episodes, whatever their rewards (a base model solves few or none): every episode
  # of the copy a success, rft on every turn of each (bench/episode_rows.py --as-successes)
  common_log "rft on every turn of $EPISODES episodes: one row per turn, then one per episode"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.episode_rows --log "$log" --model "$model" --iteration 1 \
    --episodes "$EPISODES" --relabel successes -- algorithm=rft algorithm.selection.positive_samples_to_train=100000 \
    algorithm.selection.skip_unchanged_steps=false algorithm.selection.shortest_per_task=0 \
    algorithm.selection.last_k_iterations=1 "${common[@]}"
  common_log "grpo on $EPISODES episodes, every other one a success: one row per turn, then one per episode"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.episode_rows --log "$log" --model "$model" --iteration 1 \
    --episodes "$EPISODES" --relabel alternate -- algorithm=grpo "${common[@]}"
}

#: episodes of the rollout the rft measurement trains (each a success in the benchmark's copy)
EPISODES=${BATON_ROWS_EPISODES:-24}

main "$@"; exit
