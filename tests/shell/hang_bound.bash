# Sourced by bats files (bats `load hang_bound`): the only timing checks the shell tests make. Only a
# hang breaks one: each bound is far above what the step takes on a loaded 2-core AVX2 machine, and
# below what it takes without the behaviour under test (a wait for its whole poll, a process that
# ignores the signal).
# shellcheck shell=bash

# hang_bound <limit_s> <since> <what>: fail, naming <what>, once $SECONDS - <since> has reached <limit_s>.
hang_bound() {
  local took=$((SECONDS - $2))
  ((took < $1)) && return 0
  printf 'hang: %s took %ss (bound %ss, which only a hang reaches)\n' "$3" "$took" "$1" >&2
  return 1
}

# ends_within <limit_s> <pid> <what>: poll until the background child <pid> has exited (a zombie or
# gone); fail, naming <what>, after <limit_s> s, so that a hang fails the test instead of blocking it.
# A `wait <pid>` after it returns the exit code at once.
ends_within() {
  local deadline=$((SECONDS + $1)) state
  while state=$(ps -o stat= -p "$2") && [[ $state != Z* ]]; do
    if ((SECONDS >= deadline)); then
      printf 'hang: %s: pid %s still running after %ss (a bound only a hang reaches)\n' "$3" "$2" "$1" >&2
      return 1
    fi
    sleep 0.1
  done
}
