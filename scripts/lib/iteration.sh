#!/usr/bin/env bash
# Iteration numbering and phase markers persisted under <log>/run/state, so a
# restart continues the numbering and --resume skips the phases already done.
#
#   <log>/run/state/iter_<NNNN>/<phase>.done   one marker per finished phase
#   <log>/run/state/iter_<NNNN>/times          "<phase> <seconds>" lines
#   <log>/run/state/iter_<NNNN>/config.yaml    the resolved configuration
# The same paths as rollout_engine/layout.py (Layout.state_dir, .marker, .times);
# coordinator/runstate.py reads them. Library file: defines functions only. Needs common.sh.

# iteration_state_dir <log> <n>: print the state directory of iteration <n>.
iteration_state_dir() {
  printf '%s/run/state/iter_%04d\n' "$1" "$2"
}

# iteration_last <log>: print the highest iteration with a state directory (0: none).
iteration_last() {
  local dir best=0 n
  for dir in "$1"/run/state/iter_*; do
    [[ -d $dir ]] || continue
    n=${dir##*/iter_}
    [[ $n =~ ^[0-9]+$ ]] || continue
    n=$((10#$n))
    ((n > best)) && best=$n
  done
  printf '%s\n' "$best"
}

# iteration_is_done <log> <n> <phase>: true when <phase> of iteration <n> finished.
iteration_is_done() {
  [[ -f $(iteration_state_dir "$1" "$2")/$3.done ]]
}

# iteration_mark <log> <n> <phase> [content]: record that <phase> finished (atomic).
iteration_mark() {
  local dir
  dir=$(iteration_state_dir "$1" "$2")
  mkdir -p "$dir"
  printf '%s\n' "${4:-$(date +%s)}" >"$dir/.$3.done.tmp"
  mv -f "$dir/.$3.done.tmp" "$dir/$3.done"
}

# iteration_next <log>: print the iteration to run now: the last one if it is
# unfinished, else last + 1 (reads only).
iteration_next() {
  local log=$1 last
  last=$(iteration_last "$log")
  if ((last == 0)) || iteration_is_done "$log" "$last" iteration; then
    printf '%s\n' $((last + 1))
  else
    printf '%s\n' "$last"
  fi
}

# iteration_restart <log> <n>: forget the finished phases of an interrupted
# iteration <n> so that it runs again from the start (its journals are moved
# aside by the rollout engine, never overwritten).
iteration_restart() {
  local dir
  dir=$(iteration_state_dir "$1" "$2")
  [[ -d $dir ]] || return 0
  compgen -G "$dir/*.done" >/dev/null || return 0
  common_warn "iteration $2 was interrupted; starting it again (pass --resume to continue it)"
  rm -f "$dir"/*.done "$dir/times"
}

# iteration_eval_due <n> <interval>: true when iteration <n> evaluates
# (n % interval == 1; interval 1 evaluates every iteration).
iteration_eval_due() {
  local n=$1 interval=$2
  ((interval == 1 || n % interval == 1))
}

# iteration_add_time <log> <n> <phase> <seconds>: record how long <phase> took.
iteration_add_time() {
  local dir
  dir=$(iteration_state_dir "$1" "$2")
  mkdir -p "$dir"
  printf '%s %s\n' "$3" "$4" >>"$dir/times"
}
