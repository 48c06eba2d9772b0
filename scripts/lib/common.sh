#!/usr/bin/env bash
# Shared helpers for Baton's shell scripts: logging, errors, paths.
# Library file: defines functions only.

# common_log <msg...>: print a progress line to stderr.
common_log() {
  printf '[baton] %s\n' "$*" >&2
}

# common_die <code> <msg...>: print an error to stderr and exit with <code>.
common_die() {
  local code=$1
  shift
  printf '[baton] error: %s\n' "$*" >&2
  exit "$code"
}

# common_repo_root: print the absolute path of the repository.
common_repo_root() {
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  printf '%s\n' "$here"
}

# common_baton_home: print the cache directory for environments and downloads.
common_baton_home() {
  printf '%s\n' "${BATON_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/baton}"
}

# common_is_tty: true when stderr is a terminal.
common_is_tty() {
  [[ -t 2 ]]
}

# common_run_logged <label> <logfile> <cmd...>: run a command with its output in
# <logfile>, showing elapsed time while it runs; on failure show the log's tail.
common_run_logged() {
  local label=$1 logfile=$2
  shift 2
  local start=$SECONDS pid rc=0 next_note=15
  "$@" >>"$logfile" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if common_is_tty; then
      printf '\r[baton] %s ... %ds ' "$label" $((SECONDS - start)) >&2
    elif ((SECONDS - start >= next_note)); then
      common_log "$label ... $((SECONDS - start))s"
      next_note=$((next_note + 30))
    fi
  done
  wait "$pid" || rc=$?
  common_is_tty && printf '\r' >&2
  if ((rc != 0)); then
    common_log "$label failed (exit $rc) after $((SECONDS - start))s; last lines of $logfile:"
    tail -n 25 "$logfile" >&2
    return "$rc"
  fi
  common_log "$label done in $((SECONDS - start))s"
}
