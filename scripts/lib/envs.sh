#!/usr/bin/env bash
# The three Python environments (app, serve, train): where they live, which
# variant this machine needs, and the interpreter paths every script uses.
# Library file: defines functions only. Needs common.sh.

# envs_device: print "cuda" when an NVIDIA GPU is usable, else "cpu".
# BATON_DEVICE=cpu|cuda overrides the detection.
envs_device() {
  case "${BATON_DEVICE:-}" in
    cpu | cuda)
      printf '%s\n' "$BATON_DEVICE"
      return 0
      ;;
    "") ;;
    *) common_die 2 "BATON_DEVICE must be cpu or cuda (got '$BATON_DEVICE'); unset it to auto-detect" ;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    printf 'cuda\n'
  else
    printf 'cpu\n'
  fi
}

# envs_gpu_count: print the number of NVIDIA GPUs this process may use (0 without any): those
# `nvidia-smi -L` lists, or fewer when CUDA_VISIBLE_DEVICES names fewer (torch, and so the trainer, counts
# the same way; Slurm sets it for a job given part of a node, and nvidia-smi may still list them all).
envs_gpu_count() {
  local listed visible
  [[ $(envs_device) == cuda ]] || { printf '0\n' && return 0; }
  listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || listed=0
  if [[ -v CUDA_VISIBLE_DEVICES ]]; then
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]') || visible=0
    ((visible >= listed)) || listed=$visible
  fi
  printf '%s\n' "$listed"
}

# envs_recipe_name <env>: print the recipe name for <env> on this machine.
envs_recipe_name() {
  local env=$1
  case "$env" in
    serve) printf 'serve-%s\n' "$(envs_device)" ;;
    app | train) printf '%s\n' "$env" ;;
    *) common_die 2 "unknown environment '$env' (expected app, serve or train)" ;;
  esac
}

# envs_base_python: print a Python >= 3.11 to build environments from.
envs_base_python() {
  local candidate
  for candidate in "${BATON_PYTHON:-}" python3.11 python3.12 python3; do
    [[ -n $candidate ]] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

# envs_dir <env>...: print the cache directory of each <env> for the current pins, one a line (one
# interpreter start for them all: run.sh pays this on every start).
envs_dir() {
  local env base hashes recipes=() i=0
  for env in "$@"; do
    recipes+=("$(envs_recipe_name "$env")") || return 1
  done
  base=$(envs_base_python) || common_die 1 "no Python 3.11 or 3.12 found; install python3.11 or set BATON_PYTHON"
  hashes=$("$base" "$(common_repo_root)/scripts/lib/pins.py" "${recipes[@]}" --hash) || return 1
  while read -r hash; do
    printf '%s/envs/%s-%s\n' "$(common_baton_home)" "${recipes[i]}" "$hash"
    i=$((i + 1))
  done <<<"$hashes"
}

# envs_is_complete <dir>: true when <dir> holds an environment that verified itself.
envs_is_complete() {
  local dir=$1
  [[ -f $dir/.baton-verified && -x $dir/bin/python ]] && "$dir/bin/python" -c 'pass' 2>/dev/null
}

# envs_python <env>: print the interpreter of a complete <env>, or fail with a hint.
envs_python() {
  envs_pythons "$1"
}

# envs_pythons <env>...: print the interpreter of each complete <env>, one a line, or fail with a hint.
envs_pythons() {
  local dirs dir env i=0
  dirs=$(envs_dir "$@") || return 1
  local -a found
  mapfile -t found <<<"$dirs"
  for env in "$@"; do
    dir=${found[i]}
    i=$((i + 1))
    envs_is_complete "$dir" || common_die 1 "the $env environment is not set up ($dir); run: bash scripts/setup.sh"
    printf '%s/bin/python\n' "$dir"
  done
}

# envs_export: export BATON_APP_PY, BATON_SERVE_PY, BATON_TRAIN_PY and
# BATON_TRAIN_BIN for the current pins (fails with a hint if one is missing).
envs_export() {
  local pythons
  pythons=$(envs_pythons app serve train) || return 1
  {
    read -r BATON_APP_PY
    read -r BATON_SERVE_PY
    read -r BATON_TRAIN_PY
  } <<<"$pythons"
  BATON_TRAIN_BIN=$(dirname "$BATON_TRAIN_PY")
  export BATON_APP_PY BATON_SERVE_PY BATON_TRAIN_PY BATON_TRAIN_BIN
}
