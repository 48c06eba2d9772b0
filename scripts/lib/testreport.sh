#!/usr/bin/env bash
# test.sh's reports: which tests pytest deselects on this machine, and the final
# tally of passed, failed, skipped and deselected tests over one reports
# directory (JUnit XML from pytest, TAP from bats, and the deselected tests that
# tests/conftest.py lists in *.deselected because JUnit XML has no place for them).
# Policy: nothing may be skipped; a test that needs a GPU carries the `gpu`
# marker and is deselected on a machine without one; a test longer than the
# suite's budget allows carries `long` and runs only with BATON_TEST_LONG=1.
# Library file: defines functions only. Needs common.sh, envs.sh and BATON_APP_PY.

# testreport_pytest_filter: print pytest's arguments (one a line) that deselect
# the `gpu` tests on a machine without an NVIDIA GPU and the `long` tests unless
# BATON_TEST_LONG=1; nothing when neither is deselected.
testreport_pytest_filter() {
  local -a not=()
  [[ $(envs_device) == cuda ]] || not+=("not gpu")
  [[ ${BATON_TEST_LONG:-} == 1 ]] || not+=("not long")
  ((${#not[@]})) || return 0
  local expr=${not[0]}
  ((${#not[@]} == 1)) || expr+=" and ${not[1]}"
  printf '%s\n' -m "$expr"
}

# testreport_summary <reports> <stage_failed>: print one `skipped: NAME (reason)`
# line per skipped test and the policy, then, last, `tests: P passed, F failed,
# S skipped, D deselected (why)`; non-zero if a test failed or was skipped, or <stage_failed> is not 0
# (a stage that failed outside any counted test, such as lint or a collection
# error, counts as 1 failed).
testreport_summary() {
  "$BATON_APP_PY" - "$1" "$2" <<'PY'
import glob, re, sys, xml.etree.ElementTree as ET
from collections import Counter

reports, stage_failed = sys.argv[1], sys.argv[2] != "0"
tally, skipped, deselected = Counter(), [], Counter()


def junit(path):
    """pytest's JUnit XML: each testcase failed (failure or error), skipped, or passed."""
    for case in ET.parse(path).getroot().iter("testcase"):
        name = "::".join(part for part in (case.get("classname"), case.get("name")) if part)
        if case.find("failure") is not None or case.find("error") is not None:
            tally["failed"] += 1
        elif (skip := case.find("skipped")) is not None:
            tally["skipped"] += 1
            skipped.append(f"{name} ({skip.get('message') or skip.get('type') or 'no reason'})")
        else:
            tally["passed"] += 1


def tap(path):
    """bats' TAP: `ok N name`, `ok N name # skip [reason]`, `not ok N name`."""
    for line in open(path):
        if line.startswith("not ok "):
            tally["failed"] += 1
        elif skip := re.match(r"ok \d+ (.*?) # skip(?: (.*))?$", line.rstrip("\n")):
            tally["skipped"] += 1
            skipped.append(f"{skip[1]} ({skip[2] or 'no reason'})")
        elif line.startswith("ok "):
            tally["passed"] += 1


def deselect(path):
    """tests/conftest.py's list: `gpu|other <node id>` a line."""
    for line in open(path):
        if line.strip():
            deselected[line.split()[0]] += 1


for pattern, read in (("*.xml", junit), ("*.tap", tap), ("*.deselected", deselect)):
    for path in sorted(glob.glob(f"{glob.escape(reports)}/{pattern}")):
        read(path)
if stage_failed and not tally["failed"]:
    tally["failed"] = 1
why = ", ".join(f"{n} {label}" for label, n in sorted(deselected.items()))
if len(deselected) == 1:
    why = next(iter(deselected))
for name in skipped:
    print(f"skipped: {name}")
if skipped:
    print("skipped tests are not allowed: make them run here, or mark a GPU-only test @pytest.mark.gpu")
counts = ", ".join(f"{tally[k]} {k}" for k in ("passed", "failed", "skipped"))
print(f"tests: {counts}, {deselected.total()} deselected" + (f" ({why})" if why else ""))
sys.exit(1 if tally["failed"] or tally["skipped"] else 0)
PY
}
