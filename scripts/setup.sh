#!/usr/bin/env bash
# Build (or reuse) Baton's three Python environments and the system packages
# they need. Idempotent: a rerun with everything in place takes seconds.
#
#   bash scripts/setup.sh [--only app|serve|train]... [--rebuild] [--no-apt] [--for-tests]
#
# Environments live in $BATON_HOME/envs (default ~/.cache/baton/envs), keyed by
# a hash of their recipe in pyproject.toml and their lock file (scripts/locks/,
# pip constraints for every install: transitive pins too). One counts as complete only
# after it verified itself (imports and commands); an incomplete one is removed
# and rebuilt, never reused.
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"
# shellcheck source=scripts/lib/sysdeps.sh
source "$ROOT/scripts/lib/sysdeps.sh"

usage() {
  cat <<'EOF'
Usage: bash scripts/setup.sh [--only ENV]... [--rebuild] [--no-apt] [--for-tests]

Creates the app, serve and train environments under $BATON_HOME/envs and
installs the system packages they need (Debian: chromium, gcc).

  --only ENV    set up only ENV (app, serve or train); repeatable
  --rebuild     delete and rebuild the selected environments
  --no-apt      never run apt-get; fail with the packages to install instead
  --for-tests   also the system packages only the tests need (Debian: slurm-wlm
                and munge, a real Slurm for tests/e2e/test_slurm.py; glusterfs-server,
                glusterfs-client, sshfs, openssh-server and iproute2, a real shared
                filesystem for the multi-node tests)
  -h, --help    show this help
EOF
}

# setup_build_env <env> <dir> <recipe>: create <dir> from <recipe>'s steps.
setup_build_env() {
  local env=$1 dir=$2 recipe=$3 base log kind line
  local -a args
  base=$(envs_base_python)
  log="$(common_baton_home)/logs/setup-$env.log"
  mkdir -p "$(dirname "$log")"
  : >"$log"
  rm -rf "$dir"
  common_log "$env: creating $dir (log: $log)"
  "$base" -m venv "$dir"
  common_run_logged "$env: upgrading pip" "$log" "$dir/bin/python" -m pip install --upgrade 'pip>=24' \
    -c "$ROOT/scripts/locks/$recipe.txt" || return 1
  while IFS=$'\t' read -r -a args; do
    kind=${args[0]}
    args=("${args[@]:1}")
    case "$kind" in
      install)
        line="${args[*]}"
        common_run_logged "$env: pip install ${line:0:70}" "$log" \
          "$dir/bin/python" -m pip install --progress-bar off "${args[@]}" || return 1
        ;;
      remove)
        common_run_logged "$env: removing ${args[*]}" "$log" "$dir/bin/python" -m pip uninstall -y "${args[@]}" || return 1
        ;;
      site)
        common_run_logged "$env: copying ${args[*]##*/} into site-packages" "$log" "$dir/bin/python" -c \
          "import shutil, sys, sysconfig; [shutil.copy(f, sysconfig.get_paths()['purelib']) for f in sys.argv[1:]]" \
          "${args[@]/#/$ROOT/}" || return 1
        ;;
      import | command | resource) ;;
      *) common_die 1 "setup: unknown recipe step '$kind'" ;;
    esac
  done < <("$base" "$ROOT/scripts/lib/pins.py" "$recipe")
}

# setup_verify_env <env> <dir> <recipe>: run the recipe's checks; mark verified.
setup_verify_env() {
  local env=$1 dir=$2 recipe=$3 base log kind
  local -a args
  base=$(envs_base_python)
  log="$(common_baton_home)/logs/setup-$env.log"
  while IFS=$'\t' read -r -a args; do
    kind=${args[0]}
    args=("${args[@]:1}")
    case "$kind" in
      import)
        common_run_logged "$env: verifying imports (${args[*]})" "$log" \
          "$dir/bin/python" -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" "${args[@]}" || return 1
        ;;
      resource)
        common_run_logged "$env: verifying ${args[0]} ships ${args[1]}" "$log" \
          "$dir/bin/python" -c "import importlib.util, pathlib, sys; spec = importlib.util.find_spec(sys.argv[1]); sys.exit(0 if (pathlib.Path(spec.origin).parent / sys.argv[2]).is_file() else 1)" "${args[@]}" || return 1
        ;;
      command)
        args[0]="$dir/bin/${args[0]}"
        common_run_logged "$env: verifying ${args[*]##*/}" "$log" "${args[@]}" || return 1
        ;;
    esac
  done < <("$base" "$ROOT/scripts/lib/pins.py" "$recipe")
  date -u +%FT%TZ >"$dir/.baton-verified"
}

# setup_env <env> <rebuild>: make sure <env> exists and verified itself.
setup_env() {
  local env=$1 rebuild=$2 dir recipe
  dir=$(envs_dir "$env")
  recipe=$(envs_recipe_name "$env")
  if [[ $rebuild == 0 ]] && envs_is_complete "$dir"; then
    common_log "$env: ready ($dir)"
    return 0
  fi
  [[ -d $dir ]] && common_log "$env: $dir is incomplete or unverified; rebuilding"
  setup_build_env "$env" "$dir" "$recipe" || {
    rm -rf "$dir"
    common_die 1 "$env: install failed (see log above); check that pip reaches the package index (pip config list) and rerun"
  }
  setup_verify_env "$env" "$dir" "$recipe" || {
    rm -rf "$dir"
    common_die 1 "$env: the new environment failed its own checks (log above); it was removed, rerun to rebuild it"
  }
  common_log "$env: ready ($dir)"
}

main() {
  local rebuild=0 apt=1 for_tests=0 env
  local -a only=()
  while (($#)); do
    case "$1" in
      --only)
        [[ $# -ge 2 ]] || common_die 2 "--only needs a value (app, serve or train)"
        case "$2" in app | serve | train) only+=("$2") ;; *) common_die 2 "--only must be app, serve or train (got '$2')" ;; esac
        shift 2
        ;;
      --rebuild) rebuild=1 && shift ;;
      --no-apt) apt=0 && shift ;;
      --for-tests) for_tests=1 && shift ;;
      -h | --help) usage && return 0 ;;
      *) usage >&2 && common_die 2 "unknown argument '$1'" ;;
    esac
  done
  ((${#only[@]})) || only=(app serve train)

  envs_base_python >/dev/null || common_die 1 "Baton needs Python 3.11 or 3.12 (found: $(python3 --version 2>&1 || printf none)); install python3.11 or set BATON_PYTHON=/path/to/python3.11"
  local home lock
  home=$(common_baton_home)
  mkdir -p "$home/envs" "$home/logs"
  lock="$home/setup.lock"
  exec 9>"$lock"
  if ! flock -n 9; then
    common_log "another setup holds $lock; waiting for it"
    flock 9
  fi
  common_log "device: $(envs_device); cache: $home"
  sysdeps_ensure "$apt" "$for_tests"
  # the environments build side by side (each its own venv and log; pip's cache is safe to share): a fresh
  # machine's setup is mostly downloads and unpacking, which overlap (serve and train: 235 s against 450 s, docs/setup.md)
  local -a pids=()
  local failed=0 pid
  for env in "${only[@]}"; do
    setup_env "$env" "$rebuild" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  ((failed == 0)) || common_die 1 "setup failed (the environment named above); rerun to retry it"
  common_log "setup complete"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
