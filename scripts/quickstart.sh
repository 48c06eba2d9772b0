#!/usr/bin/env bash
# README command 1: set everything up on this machine and run Baton on the
# embedded default (SmolLM2-135M-Instruct on reasoning-gym sums).
#
#   bash scripts/quickstart.sh [--dir DIR] [key=value ...]
#
# DIR (default $BATON_QUICKSTART_DIR or ~/baton-quickstart) receives data/ and
# logs/<run>/. It prepares the model and tasks, then runs the RL loop
# (scripts/run.sh --rl-phase both, BATON_QUICKSTART_ITERATIONS iterations,
# default 4, sized for 2 cores): the base model is evaluated greedily on the 80
# held-out tasks, each iteration rolls out 128 train tasks x 4 samples and
# fine-tunes on the successes (RFT, lr 1e-4, 2 epochs), and the last policy is
# evaluated greedily on the held-out tasks again; it prints success per
# iteration, the held-out gain and the plot. Overrides given after the options
# (key=value, as run.sh takes them) come after the quickstart's own and win.
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

# quickstart_free_port: print a free TCP port on the loopback interface.
quickstart_free_port() {
  "$BATON_APP_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

main() {
  local dir=${BATON_QUICKSTART_DIR:-$HOME/baton-quickstart} data logs iterations start=$SECONDS
  local -a extra=()
  while (($#)); do
    case "$1" in
      --dir)
        [[ $# -ge 2 ]] || common_die 2 "--dir needs a value (a directory for data and logs)"
        dir=$2
        shift 2
        ;;
      -h | --help)
        sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        return 0
        ;;
      *=*)
        extra+=("$1")
        shift
        ;;
      *) common_die 2 "unknown argument '$1' (usage: bash scripts/quickstart.sh [--dir DIR] [key=value ...])" ;;
    esac
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  data="$dir/data"
  logs="$dir/logs/run-$(date +%Y%m%d-%H%M%S)"
  common_log "quickstart: data in $data, logs in $logs"

  bash "$ROOT/scripts/setup.sh"
  envs_export
  bash "$ROOT/scripts/prepare.sh" --data-path "$data"

  iterations=${BATON_QUICKSTART_ITERATIONS:-4}
  # Held-out evaluation of the base model (iteration 1) and of the last policy (--final-eval) only.
  BATON_VLLM_PORT=$(quickstart_free_port) bash "$ROOT/scripts/run.sh" --data-path "$data" --log-path "$logs" \
    --rl-phase both --eval-interval "$iterations" --max-iterations "$iterations" --final-eval \
    env_config.train_tasks_rollout_size=128 env_config.n_samples_per_task=4 env_config.test_tasks_rollout_size=-1 env_config.test_greedy=true \
    policy_config.max_new_tokens=32 algorithm.learning_rate=1e-4 algorithm.warmup_steps=0 \
    algorithm.num_train_epochs=2 algorithm.per_device_train_batch_size=8 algorithm.gradient_accumulation_steps=1 \
    algorithm.cutoff_len=512 algorithm.selection.positive_samples_to_train=128 "${extra[@]}"
  printf '\nsuccess per iteration (train rollouts and held-out eval; the last row is the final evaluation):\n'
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m coordinator table --log-path "$logs"
  printf 'plot: %s\n' "$logs/plots/success.png"
  common_log "quickstart finished in $((SECONDS - start)) s; trajectories and metrics under $logs"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
