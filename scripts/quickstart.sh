#!/usr/bin/env bash
# README command 1: set everything up on this machine and run Baton on the
# embedded default (SmolLM2-135M-Instruct on reasoning-gym sums).
#
#   bash scripts/quickstart.sh [--dir DIR]
#
# DIR (default $BATON_QUICKSTART_DIR or ~/baton-quickstart) receives data/ and
# logs/<run>/. Today it prepares the model and tasks, serves the model with
# vLLM, rolls out the held-out test tasks with the rollout engine and prints
# the success rate.
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"
# shellcheck source=scripts/lib/procs.sh
source "$ROOT/scripts/lib/procs.sh"
# shellcheck source=scripts/lib/vllm.sh
source "$ROOT/scripts/lib/vllm.sh"

RUN_DIR=""

# quickstart_cleanup: stop the process groups this run started.
quickstart_cleanup() {
  [[ -n $RUN_DIR ]] && procs_stop_all "$RUN_DIR" 30
}

# quickstart_free_port: print a free TCP port on the loopback interface.
quickstart_free_port() {
  "$BATON_APP_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# quickstart_report <log_dir>: print the success rate of the last rollout.
quickstart_report() {
  "$BATON_APP_PY" - "$1/metrics.jsonl" <<'PY'
import json, sys
rec = [json.loads(line) for line in open(sys.argv[1]) if line.strip()][-1]
print(f"\nheld-out success rate of the default model: {rec['success_rate']:.1%} "
      f"({rec['ok_episodes']} episodes, {rec['wall_s']:.0f} s, {rec['tokens_per_s']:.0f} tokens/s)")
for family, rate in sorted(rec.get("success_rate_by_family", {}).items()):
    print(f"  {family:<20} {rate:.1%}")
PY
}

main() {
  local dir=${BATON_QUICKSTART_DIR:-$HOME/baton-quickstart} port data logs start=$SECONDS
  while (($#)); do
    case "$1" in
      --dir)
        [[ $# -ge 2 ]] || common_die 2 "--dir needs a value (a directory for data and logs)"
        dir=$2
        shift 2
        ;;
      -h | --help)
        sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        return 0
        ;;
      *) common_die 2 "unknown argument '$1' (usage: bash scripts/quickstart.sh [--dir DIR])" ;;
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

  RUN_DIR=$logs
  mkdir -p "$RUN_DIR"
  trap quickstart_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  port=$(quickstart_free_port)
  vllm_start "$RUN_DIR" "$data/models/SmolLM2-135M-Instruct" "$port" policy 600
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m rollout_engine --config-name rollout_test \
    data_path="$data" log_path="$logs" policy_config.base_url="http://127.0.0.1:$port/v1" policy_config.model=policy
  vllm_stop "$RUN_DIR"
  quickstart_report "$logs"
  common_log "quickstart finished in $((SECONDS - start)) s; trajectories and metrics under $logs"
}

main "$@"
