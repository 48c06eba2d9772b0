# Sourced by bats files (bats `load bad_input`): the one check of "bad input exits 2 with one clear
# message before anything is written", for every entry point.
# shellcheck shell=bash

# expect_bad <expected message part> <command...>: the command must exit 2, say the part on stderr,
# print nothing on stdout and leave $LOG (the test's log path) uncreated.
expect_bad() {
  local want=$1
  shift
  run -2 --separate-stderr "$@"
  [[ $stderr == *"$want"* ]] || {
    printf 'stderr: %s\n' "$stderr" >&2
    return 1
  }
  [ -z "$output" ] || {
    printf 'stdout (should be empty): %s\n' "$output" >&2
    return 1
  }
  [ ! -e "$LOG" ] || {
    printf '%s was created\n' "$LOG" >&2
    return 1
  }
}
