#!/usr/bin/env bash
# README command 2: set up if needed, then run every check Baton has.
#
#   bash scripts/test.sh [lint] [unit] [shell] [e2e]
#
# With no stage named, runs them all in that order: lint (shellcheck + ruff),
# unit (pytest tests/unit), shell (bats tests/shell), e2e (pytest tests/e2e:
# real vLLM, LLaMA-Factory, Chromium). Every stage runs even after a failure;
# the exit code is non-zero if any failed. Extra pytest arguments can be
# passed in BATON_PYTEST_ARGS (e.g. "-k textworld").
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

REPORTS=""
declare -A STAGE_RESULT=() STAGE_TIME=()

# test_lint: shellcheck every script and bats file, ruff the Python.
# shellcheck disable=SC2329 # called through test_stage
test_lint() {
  local -a scripts
  mapfile -t scripts < <(cd "$ROOT" && ls scripts/*.sh scripts/lib/*.sh bench/*.sh .ci/run)
  (cd "$ROOT" && shellcheck -x "${scripts[@]}") &&
    (cd "$ROOT" && shellcheck -x -s bash tests/shell/*.bats tests/shell/*.bash) &&
    (cd "$ROOT" && ruff check . && ruff format --check coordinator rollout_engine training tests bench)
}

# test_pytest <name> <dir>: run pytest on <dir> with a JUnit report.
# shellcheck disable=SC2329 # called through test_stage
test_pytest() {
  local name=$1 dir=$2
  local -a extra=()
  read -r -a extra <<<"${BATON_PYTEST_ARGS:-}"
  (cd "$ROOT" && "$BATON_APP_PY" -m pytest "$dir" -p no:cacheprovider --durations=12 --junitxml="$REPORTS/$name.xml" "${extra[@]}")
}

# test_bats: run the shell tests with a TAP report.
# shellcheck disable=SC2329 # called through test_stage
test_bats() {
  (cd "$ROOT" && bats --tap tests/shell | tee "$REPORTS/shell.tap")
}

# test_stage <name> <fn...>: run one stage and record its result and time.
test_stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  common_log "stage $name"
  "$@" || rc=$?
  STAGE_RESULT[$name]=$rc
  STAGE_TIME[$name]=$((SECONDS - start))
}

# test_count: print "passed failed" summed over the JUnit and TAP reports.
test_count() {
  "$BATON_APP_PY" - "$REPORTS" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
passed = failed = 0
for path in glob.glob(f"{sys.argv[1]}/*.xml"):
    for suite in ET.parse(path).getroot().iter("testsuite"):
        bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        passed += int(suite.get("tests", 0)) - bad - int(suite.get("skipped", 0))
        failed += bad
for path in glob.glob(f"{sys.argv[1]}/*.tap"):
    for line in open(path):
        passed += line.startswith("ok ")
        failed += line.startswith("not ok ")
print(passed, failed)
PY
}

main() {
  local stage failed=0 passed_n failed_n
  local -a stages=("$@")
  ((${#stages[@]})) || stages=(lint unit shell e2e)
  for stage in "${stages[@]}"; do
    case "$stage" in lint | unit | shell | e2e) ;; *) common_die 2 "unknown stage '$stage' (lint, unit, shell or e2e)" ;; esac
  done
  bash "$ROOT/scripts/setup.sh"
  envs_export
  PATH="$(dirname "$BATON_APP_PY"):$PATH"
  export PATH
  REPORTS=$(mktemp -d)
  for stage in "${stages[@]}"; do
    case "$stage" in
      lint) test_stage lint test_lint ;;
      unit) test_stage unit test_pytest unit tests/unit ;;
      shell) test_stage shell test_bats ;;
      e2e) test_stage e2e test_pytest e2e tests/e2e ;;
    esac
  done
  printf '\n%-8s %-6s %s\n' stage result seconds
  for stage in "${stages[@]}"; do
    if [[ ${STAGE_RESULT[$stage]} == 0 ]]; then
      printf '%-8s %-6s %s\n' "$stage" ok "${STAGE_TIME[$stage]}"
    else
      printf '%-8s %-6s %s\n' "$stage" FAILED "${STAGE_TIME[$stage]}"
      failed=1
    fi
  done
  read -r passed_n failed_n < <(test_count)
  rm -rf "$REPORTS"
  if ((failed)) && ((failed_n == 0)); then
    failed_n=1 # a stage failed outside any counted test (lint, collection)
  fi
  printf 'tests: %s passed, %s failed\n' "$passed_n" "$failed_n"
  return "$failed"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
