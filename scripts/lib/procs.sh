#!/usr/bin/env bash
# Process groups started by Baton: start a command in its own session, record
# its group under a run directory, and stop exactly the groups recorded there.
# Library file: defines functions only. Needs common.sh.

# procs_start <run_dir> <name> <logfile> <cmd...>: start <cmd> in a new session
# (its own process group) with output appended to <logfile>; record the group
# id in <run_dir>/pids/<name>.pgid and print it.
procs_start() {
  local run_dir=$1 name=$2 logfile=$3 pid
  shift 3
  mkdir -p "$run_dir/pids" "$(dirname "$logfile")"
  # setsid without job control does not fork: $! is the new session's leader,
  # so the pid is also the process group id of everything it starts.
  setsid "$@" >>"$logfile" 2>&1 </dev/null &
  pid=$!
  printf '%s\n' "$pid" >"$run_dir/pids/$name.pgid.tmp"
  mv -f "$run_dir/pids/$name.pgid.tmp" "$run_dir/pids/$name.pgid"
  printf '%s\n' "$pid"
}

# procs_pgid <run_dir> <name>: print the recorded group id of <name>, if any.
procs_pgid() {
  local file="$1/pids/$2.pgid"
  [[ -f $file ]] && cat "$file"
}

# procs_group_alive <pgid>: true while a process of the group runs (zombies,
# which only wait for their parent to reap them, do not count).
procs_group_alive() {
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# procs_stop <run_dir> <name> [grace_s]: SIGTERM the recorded group, wait up to
# grace_s (default 20) seconds, then SIGKILL what is left; forget the record.
procs_stop() {
  local run_dir=$1 name=$2 grace=${3:-20} pgid waited=0
  pgid=$(procs_pgid "$run_dir" "$name") || return 0
  if [[ $pgid =~ ^[0-9]+$ ]] && procs_group_alive "$pgid"; then
    kill -TERM -- "-$pgid" 2>/dev/null || true
    while procs_group_alive "$pgid" && ((waited < grace * 10)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    if procs_group_alive "$pgid"; then
      common_warn "$name (group $pgid) ignored SIGTERM for ${grace}s; sending SIGKILL"
      kill -KILL -- "-$pgid" 2>/dev/null || true
      sleep 0.2
    fi
    wait "$pgid" 2>/dev/null || true # reap it when it is our child
  fi
  rm -f "$run_dir/pids/$name.pgid"
}

# procs_stop_all <run_dir> [grace_s]: stop every group recorded under <run_dir>.
procs_stop_all() {
  local run_dir=$1 grace=${2:-20} file
  for file in "$run_dir"/pids/*.pgid; do
    [[ -e $file ]] || continue
    procs_stop "$run_dir" "$(basename "$file" .pgid)" "$grace"
  done
}
