#!/usr/bin/env bash
# Regenerate scripts/locks/<recipe>.txt: every package one environment's
# install steps bring in, pinned. scripts/setup.sh installs each step with the
# lock as pip constraints (`-c`), and the environment's cache key hashes it, so
# a transitive pin that moves builds a new environment. Run after changing an
# extra in pyproject.toml, then commit the lock with it.
#
#   bash scripts/lock.sh app|serve-cpu|train   # built for real in a scratch venv, then `pip freeze --all`
#   bash scripts/lock.sh serve-cuda            # resolved without installing (`uv pip compile`): no GPU needed
#
# A built lock is what pip installed on this machine (Python 3.11, linux
# x86_64; its pip configuration: the CPU torch wheel comes from a local file),
# taken after the install steps and before the recipe's `remove` steps, so the
# packages the recipe removes are pinned too. serve-cuda cannot be built
# without an NVIDIA GPU: uv resolves it for linux x86_64, Python 3.11.
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

UV_VERSION=0.13.9
UV_PLATFORM=x86_64-manylinux_2_28
SCRATCH=""

usage() {
  cat <<'EOF'
Usage: bash scripts/lock.sh RECIPE

Writes scripts/locks/RECIPE.txt (RECIPE: app, serve-cpu, serve-cuda or train).
app, serve-cpu and train are built in a scratch venv from pyproject.toml's
extras and frozen; serve-cuda is resolved with uv for linux x86_64, Python 3.11.
EOF
}

# lock_header <recipe> <how>: print the lock file's comment header.
lock_header() {
  printf '# Lock of the %s environment: pip constraints for every install step of its recipe\n' "$1"
  printf '# (scripts/lib/pins.py, scripts/setup.sh). Do not edit: regenerate with bash scripts/lock.sh %s\n' "$1"
  printf '# %s\n' "$2"
}

# lock_built <recipe> <venv>: run the recipe's install steps (unlocked) in <venv>; print its freeze.
lock_built() {
  local recipe=$1 venv=$2 base log kind
  local -a args
  base=$(envs_base_python) || common_die 1 "no Python 3.11 or 3.12 found; install python3.11 or set BATON_PYTHON"
  log="$venv.log"
  "$base" -m venv "$venv"
  common_run_logged "$recipe: upgrading pip" "$log" "$venv/bin/python" -m pip install --upgrade 'pip>=24' ||
    common_die 1 "$recipe: pip upgrade failed (log: $log)"
  while IFS=$'\t' read -r -a args; do
    kind=${args[0]}
    [[ $kind == install ]] || continue
    common_run_logged "$recipe: pip install ${args[*]:1:4} ..." "$log" \
      "$venv/bin/python" -m pip install --progress-bar off "${args[@]:1}" ||
      common_die 1 "$recipe: install failed (log: $log)"
  done < <("$base" "$ROOT/scripts/lib/pins.py" "$recipe" --unlocked)
  lock_header "$recipe" "Made by pip freeze --all after the install steps (before any remove step), Python $("$venv/bin/python" -c 'import platform; print(platform.python_version(), platform.system().lower(), platform.machine())')."
  "$venv/bin/python" -m pip freeze --all
}

# lock_resolved <recipe> <venv>: resolve the recipe's extras with uv in <venv> without installing them.
lock_resolved() {
  local recipe=$1 venv=$2 base log arg
  local -a args reqs=()
  base=$(envs_base_python) || common_die 1 "no Python 3.11 or 3.12 found; install python3.11 or set BATON_PYTHON"
  log="$venv.log"
  "$base" -m venv "$venv"
  common_run_logged "$recipe: installing uv $UV_VERSION" "$log" "$venv/bin/python" -m pip install --upgrade \
    'pip>=24' "uv==$UV_VERSION" || common_die 1 "$recipe: could not install uv (log: $log)"
  while IFS=$'\t' read -r -a args; do
    [[ ${args[0]} == install ]] || continue
    for arg in "${args[@]:1}"; do [[ $arg == -* ]] || reqs+=("$arg"); done
  done < <("$base" "$ROOT/scripts/lib/pins.py" "$recipe" --unlocked)
  lock_header "$recipe" "Resolved without installing: uv $UV_VERSION pip compile --python-version 3.11 --python-platform $UV_PLATFORM (PyPI), pip as in a built lock."
  printf '%s\n' "${reqs[@]}" |
    "$venv/bin/uv" pip compile - --python-version 3.11 --python-platform "$UV_PLATFORM" --no-header --no-annotate \
      --index-url https://pypi.org/simple 2>>"$log"
  "$venv/bin/python" -m pip freeze --all | grep '^pip=='
}

main() {
  [[ $# -eq 1 ]] || { usage >&2 && common_die 2 "lock.sh needs one recipe (got $# arguments)"; }
  local recipe=$1 out
  case "$recipe" in
    -h | --help) usage && return 0 ;;
    app | serve-cpu | serve-cuda | train) ;;
    *) usage >&2 && common_die 2 "RECIPE must be app, serve-cpu, serve-cuda or train (got '$recipe')" ;;
  esac
  SCRATCH=$(mktemp -d)
  trap 'rm -rf "$SCRATCH"' EXIT
  out="$ROOT/scripts/locks/$recipe.txt"
  mkdir -p "$(dirname "$out")"
  if [[ $recipe == serve-cuda ]]; then
    lock_resolved "$recipe" "$SCRATCH/venv" >"$SCRATCH/lock.txt"
  else
    lock_built "$recipe" "$SCRATCH/venv" >"$SCRATCH/lock.txt"
  fi
  mv -f "$SCRATCH/lock.txt" "$out"
  common_log "wrote $out ($(grep -vc '^#' "$out") packages); commit it with the pyproject.toml change"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
