#!/usr/bin/env bash
# Learning curve of the default model on the default tasks: the real RL loop
# (scripts/run.sh --rl-phase both) for several iterations, evaluated on the
# held-out test tasks every iteration; prints the success table and the plot.
#
#   bash bench/learning_curve.sh [--iterations N] [--algorithm rft|grpo] [--log-path DIR] [extra overrides...]
#
# --algorithm (default rft): the update's objective. Both take the same rollouts
# (128 train tasks x 4 samples an iteration), learning rate, epochs and batch;
# rft draws at most 128 successes, grpo trains every episode of the tasks whose
# samples disagree. Two runs side by side: bench/compare_curves.py.
# Outside CI (about 4-6 minutes per iteration on 2 cores). Record the table and
# the command in docs/benchmarks.md ("Learning curve").
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

main() {
  local iterations=8 log="" algorithm=rft data=${BATON_DATA:-$(common_baton_home)/bench-data}
  local -a extra=() objective=()
  while (($#)); do
    case "$1" in
      --iterations)
        [[ $# -ge 2 ]] || common_die 2 "--iterations needs a value"
        iterations=$2
        shift 2
        ;;
      --algorithm)
        [[ $# -ge 2 ]] || common_die 2 "--algorithm needs a value (rft or grpo)"
        algorithm=$2
        shift 2
        ;;
      --log-path)
        [[ $# -ge 2 ]] || common_die 2 "--log-path needs a value"
        log=$2
        shift 2
        ;;
      -h | --help)
        sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        return 0
        ;;
      *) extra+=("$1") && shift ;;
    esac
  done
  case "$algorithm" in
    rft) objective=(algorithm=rft algorithm.selection.positive_samples_to_train=128) ;;
    grpo) objective=(algorithm=grpo) ;;
    *) common_die 2 "--algorithm: '$algorithm' is not rft or grpo" ;;
  esac
  log=${log:-$(common_baton_home)/bench-logs/learning-curve-$algorithm-$(date +%Y%m%d-%H%M%S)}
  envs_export
  bash "$ROOT/scripts/prepare.sh" --data-path "$data"
  bash "$ROOT/scripts/run.sh" --data-path "$data" --log-path "$log" --rl-phase both --eval-interval 1 \
    --max-iterations "$iterations" \
    env_config.train_tasks_rollout_size=128 env_config.n_samples_per_task=4 env_config.test_tasks_rollout_size=-1 \
    policy_config.max_new_tokens=48 algorithm.learning_rate=1e-4 algorithm.warmup_steps=0 \
    algorithm.num_train_epochs=2 algorithm.per_device_train_batch_size=8 algorithm.gradient_accumulation_steps=1 \
    algorithm.cutoff_len=512 "${objective[@]}" "${extra[@]}"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m coordinator table --log-path "$log"
  common_log "plot: $log/plots/success.png"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
