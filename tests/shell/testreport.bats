#!/usr/bin/env bats
# test.sh's tally (scripts/lib/testreport.sh): passed, failed, skipped and
# deselected tests from JUnit, TAP and deselected-list reports; a skip fails the
# run and is named; the `gpu` tests are deselected on a machine without a GPU,
# the `long` ones without BATON_TEST_LONG=1.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  source "$ROOT/scripts/lib/testreport.sh"
  BATON_APP_PY=$(envs_python app)
  REPORTS="$BATS_TEST_TMPDIR/reports"
  FAKEBIN="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$REPORTS" "$FAKEBIN"
  unset BATON_DEVICE
}

# junit <file> <testcase xml...>: write a pytest-style JUnit report.
junit() {
  local file=$1
  shift
  printf '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest">%s</testsuite></testsuites>\n' \
    "$*" >"$REPORTS/$file"
}

# passing_reports: 2 pytest passes, 2 bats passes, 2 gpu tests deselected.
passing_reports() {
  junit unit.xml '<testcase classname="tests.unit.test_a" name="test_one"/>' \
    '<testcase classname="tests.unit.test_a" name="test_two"/>'
  printf '1..2\nok 1 first\nok 2 second # has a hash\n' >"$REPORTS/shell.tap"
  printf 'gpu tests/unit/test_a.py::test_cuda\ngpu tests/e2e/test_b.py::test_vllm_cuda\n' >"$REPORTS/pytest.deselected"
}

@test "testreport_summary: passes and gpu deselections exit 0 with the tally last" {
  passing_reports
  run -0 testreport_summary "$REPORTS" 0
  [ "$output" = "tests: 4 passed, 0 failed, 0 skipped, 2 deselected (gpu)" ]
}

@test "testreport_summary: no reports at all (lint only) is all zeros and exit 0" {
  run -0 testreport_summary "$REPORTS" 0
  [ "$output" = "tests: 0 passed, 0 failed, 0 skipped, 0 deselected" ]
}

@test "testreport_summary: failures, errors and 'not ok' count as failed, exit 1" {
  junit unit.xml '<testcase classname="m" name="test_ok"/>' \
    '<testcase classname="m" name="test_bad"><failure message="assert 0">x</failure></testcase>' \
    '<testcase classname="" name="tests.unit.test_c"><error message="collection failure">x</error></testcase>'
  printf '1..2\nok 1 first\nnot ok 2 second\n# (in test file x.bats, line 3)\n' >"$REPORTS/shell.tap"
  run -1 testreport_summary "$REPORTS" 1
  [ "$output" = "tests: 2 passed, 3 failed, 0 skipped, 0 deselected" ]
}

@test "testreport_summary: a failed stage with no failed test (lint) counts 1 failed, exit 1" {
  passing_reports
  run -1 testreport_summary "$REPORTS" 1
  [ "$output" = "tests: 4 passed, 1 failed, 0 skipped, 2 deselected (gpu)" ]
}

@test "testreport_summary: pytest and bats skips count as skipped, not passed, are named, and exit 1" {
  passing_reports
  junit e2e.xml '<testcase classname="tests.e2e.test_d" name="test_gone"><skipped type="pytest.skip" message="no CUDA">x</skipped></testcase>' \
    '<testcase classname="tests.e2e.test_d" name="test_here"/>'
  printf '1..3\nok 1 runs\nok 2 needs docker # skip no docker\nok 3 bare # skip\n' >"$REPORTS/more.tap"
  run -1 testreport_summary "$REPORTS" 0
  [ "${lines[0]}" = "skipped: tests.e2e.test_d::test_gone (no CUDA)" ]
  [ "${lines[1]}" = "skipped: needs docker (no docker)" ]
  [ "${lines[2]}" = "skipped: bare (no reason)" ]
  [[ ${lines[3]} == "skipped tests are not allowed: "* ]]
  [ "${lines[4]}" = "tests: 6 passed, 0 failed, 3 skipped, 2 deselected (gpu)" ]
  [ "${#lines[@]}" = 5 ]
}

@test "testreport_summary: deselections for two reasons are counted per reason" {
  passing_reports
  printf 'other tests/unit/test_a.py::test_three\n' >>"$REPORTS/pytest.deselected"
  run -0 testreport_summary "$REPORTS" 0
  [ "$output" = "tests: 4 passed, 0 failed, 0 skipped, 3 deselected (2 gpu, 1 other)" ]
}

# fake_nvidia_smi <sh>: an nvidia-smi in FAKEBIN that runs <sh>.
fake_nvidia_smi() {
  printf '#!/bin/sh\n%s\n' "$1" >"$FAKEBIN/nvidia-smi"
  chmod +x "$FAKEBIN/nvidia-smi"
}

@test "testreport_pytest_filter: deselects the gpu tests without a GPU, nothing with one" {
  export BATON_TEST_LONG=1 # the long tests kept: the next test deselects them
  fake_nvidia_smi 'echo "NVIDIA-SMI has failed" >&2; exit 9'
  PATH="$FAKEBIN:$PATH" run -0 testreport_pytest_filter
  [ "$output" = $'-m\nnot gpu' ]
  fake_nvidia_smi 'printf "GPU 0: NVIDIA H100 (UUID: a)\n"'
  PATH="$FAKEBIN:$PATH" run -0 testreport_pytest_filter
  [ -z "$output" ]
}

@test "real pytest: tests/conftest.py lists a gpu test deselected; a skip is tallied and named" {
  mkdir -p "$BATS_TEST_TMPDIR/t"
  printf '%s\n' 'import pytest' '' '' 'def test_runs():' '    pass' '' '' '@pytest.mark.gpu' 'def test_cuda():' \
    '    pass' '' '' 'def test_gone():' '    pytest.skip("not here")' >"$BATS_TEST_TMPDIR/t/test_fake.py"
  local -a filter
  mapfile -t filter < <(BATON_DEVICE=cpu testreport_pytest_filter)
  cd "$ROOT"
  BATON_TEST_REPORTS=$REPORTS run -0 "$BATON_APP_PY" -m pytest -c pyproject.toml -p tests.conftest -p no:cacheprovider \
    "$BATS_TEST_TMPDIR/t/test_fake.py" --junitxml="$REPORTS/unit.xml" "${filter[@]}"
  [[ $(cat "$REPORTS/pytest.deselected") == "gpu "*"::test_cuda" ]]
  run -1 testreport_summary "$REPORTS" 0
  [ "${lines[0]}" = "skipped: test_gone (not here)" ]
  [ "${lines[2]}" = "tests: 1 passed, 0 failed, 1 skipped, 1 deselected (gpu)" ]
}

@test "testreport_pytest_filter: the long tests deselected unless BATON_TEST_LONG=1, beside the gpu ones" {
  unset BATON_TEST_LONG
  # shellcheck disable=SC2329 # called by testreport_pytest_filter
  envs_device() { echo cpu; }
  run -0 testreport_pytest_filter
  [ "$output" = $'-m\nnot gpu and not long' ]
  # shellcheck disable=SC2329 # called by testreport_pytest_filter
  envs_device() { echo cuda; }
  run -0 testreport_pytest_filter
  [ "$output" = $'-m\nnot long' ]
  BATON_TEST_LONG=1 run -0 testreport_pytest_filter
  [ -z "$output" ]
}

@test "real pytest: SIGTERM ends the session as Ctrl+C does, tearing down the servers its fixtures started" {
  mkdir -p "$BATS_TEST_TMPDIR/t"
  local pidfile=$BATS_TEST_TMPDIR/server.pid
  # a session fixture starting a "server" in a group of its own (as the session's vLLM), then a long test
  cat >"$BATS_TEST_TMPDIR/t/test_term.py" <<PY
import os, signal, subprocess, time
import pytest


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    open("$pidfile", "w").write(str(proc.pid))
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()


def test_long(server):
    time.sleep(300)
PY
  cd "$ROOT"
  "$BATON_APP_PY" -m pytest -c pyproject.toml -p tests.conftest -p no:cacheprovider "$BATS_TEST_TMPDIR/t/test_term.py" \
    >"$BATS_TEST_TMPDIR/out" 2>&1 &
  local pytest_pid=$! waited=0
  until [[ -s $pidfile ]]; do
    ((waited++ < 300)) || { cat "$BATS_TEST_TMPDIR/out"; false; }
    sleep 0.1
  done
  local server
  server=$(cat "$pidfile")
  kill -0 "$server"
  kill -TERM "$pytest_pid"
  local rc=0 alive=0
  wait "$pytest_pid" || rc=$?
  ! kill -0 "$server" 2>/dev/null || alive=1
  kill "$server" 2>/dev/null || true # the test leaves nothing behind, whatever its outcome
  # the fixture's teardown stopped its server: nothing outlives the session, which ends "interrupted" (2)
  [ "$alive" -eq 0 ] && [ "$rc" -eq 2 ] || { cat "$BATS_TEST_TMPDIR/out"; false; }
}
