#!/usr/bin/env bash
# Prepare a data path: the default model and the default task files.
#
#   bash scripts/prepare.sh --data-path /abs/data
#
# Skips whatever is already present and valid (checksums in each manifest).
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

# prepare_data <data_path>: build model and tasks under <data_path>.
prepare_data() {
  local data=$1
  mkdir -p "$data"
  PYTHONPATH="$ROOT" "$BATON_TRAIN_PY" -m training.default_model --data-path "$data" ||
    common_die 1 "preparing the default model failed (messages above)"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m rollout_engine.default_tasks --data-path "$data" ||
    common_die 1 "generating the default tasks failed (messages above)"
}

main() {
  local data=""
  while (($#)); do
    case "$1" in
      --data-path)
        [[ $# -ge 2 ]] || common_die 2 "--data-path needs a value: an absolute directory"
        data=$2
        shift 2
        ;;
      -h | --help)
        printf 'Usage: bash scripts/prepare.sh --data-path /abs/dir\n'
        return 0
        ;;
      *) common_die 2 "unknown argument '$1' (usage: bash scripts/prepare.sh --data-path /abs/dir)" ;;
    esac
  done
  [[ -n $data ]] || common_die 2 "--data-path is required (an absolute directory)"
  [[ $data == /* ]] || common_die 2 "--data-path must be absolute (got '$data'); use \"\$PWD/$data\""
  envs_export
  prepare_data "$data"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
