#!/usr/bin/env bash
# Process groups started by Baton: start a command in its own session, record
# its group under a run directory, and stop exactly the groups recorded there.
# Library file: defines functions only. Needs common.sh.

# procs_start <run_dir> <name> <logfile> <cmd...>: start <cmd> in a new session
# (its own process group) with output appended to <logfile> (`-`: to this
# shell's stderr, as it is); record the group id and its leader's start time in
# <run_dir>/pids/<name>.pgid; print the id.
procs_start() {
  local run_dir=$1 name=$2 logfile=$3 pid
  shift 3
  mkdir -p "$run_dir/pids"
  # setsid without job control does not fork: $! is the new session's leader,
  # so the pid is also the process group id of everything it starts.
  if [[ $logfile == - ]]; then
    setsid "$@" >&2 </dev/null &
  else
    mkdir -p "$(dirname "$logfile")"
    setsid "$@" >>"$logfile" 2>&1 </dev/null &
  fi
  pid=$!
  printf '%s %s\n' "$pid" "$(procs_start_time "$pid")" >"$run_dir/pids/$name.pgid.tmp"
  mv -f "$run_dir/pids/$name.pgid.tmp" "$run_dir/pids/$name.pgid"
  printf '%s\n' "$pid"
}

# procs_pgid <run_dir> <name>: print the recorded group id of <name>, if any.
procs_pgid() {
  local file="$1/pids/$2.pgid" pgid
  [[ -f $file ]] && read -r pgid _ <"$file" && printf '%s\n' "$pgid"
}

# procs_leader_alive <run_dir> <name>: true while the recorded group's leader
# runs: the same pid with the same start time (so not a reused pid).
procs_leader_alive() {
  local file="$1/pids/$2.pgid" pgid start
  [[ -f $file ]] && read -r pgid start <"$file" && [[ $pgid =~ ^[0-9]+$ && -n $start ]] &&
    [[ $(procs_start_time "$pgid") == "$start" ]]
}

# procs_stop_stale <run_dir> <name>: a record left by a run that died: stop its
# group when the leader is verifiably ours; otherwise only forget the record.
procs_stop_stale() {
  local pgid
  pgid=$(procs_pgid "$1" "$2") || return 0
  if procs_leader_alive "$1" "$2"; then
    common_warn "$2 (group $pgid) was left running by an earlier run; stopping it"
    procs_stop "$1" "$2" 10
  else
    procs_group_alive "$pgid" && common_warn "$2: recorded group $pgid outlived its leader; not ours to stop, check it"
    rm -f "$1/pids/$2.pgid"
  fi
}

# procs_group_alive <pgid>: true while a process of the group runs (zombies,
# which only wait for their parent to reap them, do not count).
procs_group_alive() {
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# procs_group_listens <pgid> <port>: true when a process of group <pgid> holds
# the listening TCP socket of <port> (so that whoever answers there is that group).
procs_group_listens() {
  local pgid=$1 port=$2 pid fd link inodes
  inodes=$(awk -v p="$(printf ':%04X' "$port")" \
    '$4 == "0A" && substr($2, length($2) - 4) == p { printf " %s ", $10 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  [[ -n $inodes ]] || return 1
  for pid in $(ps -e -o pid=,pgid= | awk -v g="$pgid" '$2 == g { print $1 }'); do
    for fd in /proc/"$pid"/fd/*; do
      link=$(readlink "$fd" 2>/dev/null) || continue
      [[ $link =~ ^socket:\[([0-9]+)\]$ && $inodes == *" ${BASH_REMATCH[1]} "* ]] && return 0
    done
  done
  return 1
}

# procs_group_ours <pgid> <start_time>: false when pid <pgid> now names another
# process than the leader recorded with <start_time> (a reused pid). With no
# process of that pid, members that outlived the leader are still the recorded
# group: Linux does not reuse a pid while a group of that id has members.
procs_group_ours() {
  local now
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  now=$(procs_start_time "$1") || return 0
  [[ $now == "$2" ]]
}

# procs_signal <pgid> <start_time> <signal>: send <signal> (TERM, KILL) to group
# <pgid> while it runs and is the group recorded with <start_time>
# (procs_group_ours); false when nothing was sent. A SIGTERM is followed by a
# SIGCONT (as systemd does), so a stopped group (SIGSTOP, ^Z) handles it now.
procs_signal() {
  procs_group_ours "$1" "$2" && procs_group_alive "$1" && kill "-$3" -- "-$1" 2>/dev/null || return 1
  [[ $3 != TERM ]] || kill -CONT -- "-$1" 2>/dev/null || true
}

# procs_stop <run_dir> <name> [grace_s]: SIGTERM the recorded group, wait up to
# grace_s (default 20) seconds, then SIGKILL what is left; forget the record.
# A record whose pid now names another process is never signalled.
procs_stop() {
  local run_dir=$1 name=$2 grace=${3:-20} file="$1/pids/$2.pgid" pgid start waited=0
  [[ -f $file ]] || return 0
  read -r pgid start <"$file" || true
  if procs_signal "$pgid" "$start" TERM; then
    while procs_group_ours "$pgid" "$start" && procs_group_alive "$pgid" && ((waited < grace * 10)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    if procs_group_ours "$pgid" "$start" && procs_group_alive "$pgid"; then
      common_warn "$name (group $pgid) ignored SIGTERM for ${grace}s; sending SIGKILL"
      procs_signal "$pgid" "$start" KILL || true
      sleep 0.2
    fi
    wait "$pgid" 2>/dev/null || true # reap it when it is our child
  elif [[ $pgid =~ ^[0-9]+$ ]] && ! procs_group_ours "$pgid" "$start"; then
    common_warn "$name: the recorded pid $pgid now names another process; not signalled"
  fi
  rm -f "$file"
}

# procs_start_time <pid>: print the start time of <pid> (clock ticks since boot;
# with the pid it names one process, even after the pid is reused).
procs_start_time() {
  local stat
  local -a fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) } # the fields after the command name, which may hold spaces
  read -r -a fields <<<"$stat"
  printf '%s\n' "${fields[19]}"
}

# procs_claim <run_dir> <role> [wait_s]: make this shell the owner of <role>
# under <run_dir> (owner.<role>: "host pid start_time"). Returns 1, printing
# the owner, while another live process on this host owns it. The check and the
# write are one step under a flock on <run_dir>/owner.lock; when that lock is
# not free within wait_s (default 10) seconds it claims nothing and returns 2
# with an error naming the lock.
procs_claim() {
  local run_dir=$1 file="$1/owner.$2" wait_s=${3:-10} fd host pid start rc=0
  mkdir -p "$run_dir"
  exec {fd}>>"$run_dir/owner.lock"
  if ! flock -w "$wait_s" "$fd"; then
    exec {fd}>&-
    printf '[baton] error: waited %ss for the lock %s to claim %s; another process holds it (check: fuser %s)\n' \
      "$wait_s" "$run_dir/owner.lock" "$2" "$run_dir/owner.lock" >&2
    return 2
  fi
  if [[ -f $file ]] && read -r host pid start <"$file" && [[ $host == "$(hostname)" && $pid =~ ^[0-9]+$ ]] &&
    [[ $pid != "$$" && $(procs_start_time "$pid") == "$start" ]]; then
    printf '%s\n' "$pid"
    rc=1
  else
    printf '%s %s %s\n' "$(hostname)" "$$" "$(procs_start_time "$$")" >"$file.tmp"
    mv -f "$file.tmp" "$file"
  fi
  exec {fd}>&-
  return "$rc"
}

# procs_release <run_dir> <role>: forget the owner record of <role> if it is this shell's.
procs_release() {
  local file="$1/owner.$2" host pid start
  [[ -f $file ]] && read -r host pid start <"$file" && [[ $host == "$(hostname)" && $pid == "$$" ]] && rm -f "$file"
  return 0
}
