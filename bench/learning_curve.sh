#!/usr/bin/env bash
# Learning curve of the default model on the default tasks: the real RL loop
# (scripts/run.sh --rl-phase both) for several iterations, evaluated on the
# held-out test tasks every iteration; prints the success table and the plot.
#
#   bash bench/learning_curve.sh [--iterations N] [--log-path DIR] [extra overrides...]
#
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
  local iterations=8 log="" data=${BATON_DATA:-$(common_baton_home)/bench-data}
  local -a extra=()
  while (($#)); do
    case "$1" in
      --iterations)
        [[ $# -ge 2 ]] || common_die 2 "--iterations needs a value"
        iterations=$2
        shift 2
        ;;
      --log-path)
        [[ $# -ge 2 ]] || common_die 2 "--log-path needs a value"
        log=$2
        shift 2
        ;;
      -h | --help)
        sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        return 0
        ;;
      *) extra+=("$1") && shift ;;
    esac
  done
  log=${log:-$(common_baton_home)/bench-logs/learning-curve-$(date +%Y%m%d-%H%M%S)}
  envs_export
  bash "$ROOT/scripts/prepare.sh" --data-path "$data"
  bash "$ROOT/scripts/run.sh" --data-path "$data" --log-path "$log" --rl-phase both --eval-interval 1 \
    --max-iterations "$iterations" \
    env_config.train_tasks_rollout_size=128 env_config.n_samples_per_task=4 env_config.test_tasks_rollout_size=-1 \
    policy_config.max_new_tokens=48 algorithm.learning_rate=1e-4 algorithm.warmup_steps=0 \
    algorithm.num_train_epochs=2 algorithm.per_device_train_batch_size=8 algorithm.gradient_accumulation_steps=1 \
    algorithm.cutoff_len=512 algorithm.selection.positive_samples_to_train=128 \
    "${extra[@]}"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m coordinator table --log-path "$log"
  common_log "plot: $log/plots/success.png"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
