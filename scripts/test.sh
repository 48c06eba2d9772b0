#!/usr/bin/env bash
# README command 2: set up if needed (with the e2e stage, also the system
# packages only the tests need: scripts/setup.sh --for-tests), then run every
# check Baton has.
#
#   bash scripts/test.sh [lint] [unit] [shell] [e2e]
#
# With no stage named, runs them all in that order: lint (shellcheck + ruff),
# unit (pytest tests/unit), shell (bats tests/shell), e2e (pytest tests/e2e:
# real vLLM, LLaMA-Factory, Chromium). Unit and shell run a file per core at
# once (at most 4), e2e one test at a time. Every stage runs even after a failure.
# The last line tallies the tests: passed, failed, skipped and deselected
# (the `gpu` tests on a machine without an NVIDIA GPU). The exit code is
# non-zero if a stage failed or any test was skipped: nothing may be skipped.
# Extra pytest arguments can be passed in BATON_PYTEST_ARGS (e.g. "-k textworld").
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"
# shellcheck source=scripts/lib/testreport.sh
source "$ROOT/scripts/lib/testreport.sh"

REPORTS=""
declare -A STAGE_RESULT=() STAGE_TIME=() STAGE_FREE=()

# test_lint: shellcheck every script and bats file, ruff the Python.
# shellcheck disable=SC2329 # called through test_stage
test_lint() {
  local -a scripts
  mapfile -t scripts < <(cd "$ROOT" && ls scripts/*.sh scripts/lib/*.sh scripts/slurm/*.sbatch bench/*.sh bench/gpu/*.sh .ci/run)
  (cd "$ROOT" && shellcheck -x "${scripts[@]}") &&
    (cd "$ROOT" && shellcheck -x -s bash tests/shell/*.bats tests/shell/*.bash) &&
    (cd "$ROOT" && ruff check . && ruff format --check coordinator rollout_engine training tests bench)
}

# test_pytest <name> <dir> [pytest args...]: run pytest on <dir> with a JUnit report, the `gpu`
# tests deselected on a machine without a GPU, the `long` ones without BATON_TEST_LONG=1 (BATON_PYTEST_ARGS comes last: its -m wins).
# shellcheck disable=SC2329 # called through test_stage
test_pytest() {
  local name=$1 dir=$2
  shift 2
  local -a filter=() extra=()
  mapfile -t filter < <(testreport_pytest_filter)
  read -r -a extra <<<"${BATON_PYTEST_ARGS:-}"
  (cd "$ROOT" && "$BATON_APP_PY" -m pytest "$dir" -p no:cacheprovider --durations=25 \
    --junitxml="$REPORTS/$name.xml" "$@" "${filter[@]}" "${extra[@]}")
}

# test_jobs: how many test files run at once: one per core, at most 4. The tests are mostly
# one-threaded interpreters starting, so a second core nearly halves a stage.
test_jobs() {
  local cores
  cores=$(nproc)
  echo $((cores < 4 ? cores : 4))
}

# test_bats: run the shell tests, test_jobs files at once (xargs: nothing to install), a TAP
# report per file; the largest files first (the slowest, roughly), so that the last ones to start are short.
# shellcheck disable=SC2329 # called through test_stage
test_bats() {
  # shellcheck disable=SC2016 # $1 and $2 are the inner bash's arguments
  (cd "$ROOT" && find tests/shell -name '*.bats' -printf '%s %p\n' | sort -rn | cut -d ' ' -f 2 |
    xargs -d '\n' -P "$(test_jobs)" -I {} \
      bash -c 'set -o pipefail; bats --tap "$1" | tee "$2/shell-$(basename "$1" .bats).tap"' _ {} "$REPORTS")
}

# test_free_gb: GB free where the tests write (pytest's temporary folders):
# a full disk fails a training without a traceback, so the table shows it.
test_free_gb() {
  df -P -B1G "${TMPDIR:-/tmp}" | awk 'NR == 2 { print $4 }'
}

# test_stage <name> <fn...>: run one stage and record its result, time and the free disk after it.
test_stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  common_log "stage $name ($(test_free_gb) GB free in ${TMPDIR:-/tmp})"
  "$@" || rc=$?
  STAGE_RESULT[$name]=$rc
  STAGE_TIME[$name]=$((SECONDS - start))
  STAGE_FREE[$name]=$(test_free_gb)
}

# main [stage...]: set up, run the stages, print the stage table and the test tally.
main() {
  local stage failed=0 rc=0
  local -a stages=("$@")
  ((${#stages[@]})) || stages=(lint unit shell e2e)
  for stage in "${stages[@]}"; do
    case "$stage" in lint | unit | shell | e2e) ;; *) common_die 2 "unknown stage '$stage' (lint, unit, shell or e2e)" ;; esac
  done
  if [[ " ${stages[*]} " == *" e2e "* ]]; then
    bash "$ROOT/scripts/setup.sh" --for-tests # a real Slurm for tests/e2e/test_slurm.py
  else
    bash "$ROOT/scripts/setup.sh"
  fi
  envs_export
  PATH="$(dirname "$BATON_APP_PY"):$PATH"
  export PATH
  REPORTS=$(mktemp -d)
  export BATON_TEST_REPORTS=$REPORTS # tests/conftest.py lists deselected tests there
  for stage in "${stages[@]}"; do
    case "$stage" in
      lint) test_stage lint test_lint ;;
      # each file in one worker (pytest-xdist), its module fixtures (test_carry's trainings) made once; the e2e
      # stage runs one test at a time: its timeouts are sized for a machine the test has to itself, and two at
      # once on 2 cores each took 2.4 times as long (two vLLMs' OpenMP threads on the same cores; docs/setup.md)
      unit) test_stage unit test_pytest unit tests/unit -n "$(test_jobs)" --dist loadfile ;;
      shell) test_stage shell test_bats ;;
      e2e) test_stage e2e test_pytest e2e tests/e2e ;;
    esac
  done
  printf '\n%-8s %-6s %-7s %s\n' stage result seconds "GB free after"
  for stage in "${stages[@]}"; do
    local result=ok
    [[ ${STAGE_RESULT[$stage]} == 0 ]] || { result=FAILED && failed=1; }
    printf '%-8s %-6s %-7s %s\n' "$stage" "$result" "${STAGE_TIME[$stage]}" "${STAGE_FREE[$stage]}"
  done
  testreport_summary "$REPORTS" "$failed" || rc=$?
  # each test's time is in the JUnit files (pytest prints only the slowest): what a fold is decided from
  local kept
  kept="$(common_baton_home)/test-reports"
  rm -rf "$kept" && mkdir -p "$(dirname "$kept")" && mv "$REPORTS" "$kept" && chmod 755 "$kept" &&
    common_log "the reports (JUnit with each test's time, TAP): $kept"
  return "$rc"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
