"""The exit codes that scripts/lib acts on are the ones the Python entry points name (rollout_engine/exits.py).

Bash cannot import the table, so the numbers it compares with are checked here
against it; docs/cli.md's table lists every code.
"""

from __future__ import annotations

import re
from pathlib import Path

from rollout_engine.exits import Exit, signal_exit

ROOT = Path(__file__).resolve().parents[2]


def test_the_numbers_callers_rely_on():
    assert (Exit.OK, Exit.FAILED, Exit.BAD_INPUT) == (0, 1, 2)
    assert Exit.INTERNAL == Exit.NOTHING_TO_TRAIN == Exit.RANK_FAILED == Exit.NONE_SOLVED == 3
    assert (Exit.RUN_STOPPED, Exit.EVICTED, Exit.RUN_FINISHED, Exit.POLICY_DOWN) == (4, 5, 6, 75)
    assert (Exit.SIGINT, Exit.SIGTERM) == (130, 143) == (signal_exit(2), signal_exit(15))


def test_bash_compares_with_the_same_numbers():
    loop = (ROOT / "scripts/lib/loop.sh").read_text()
    nodes = (ROOT / "scripts/lib/nodes.sh").read_text()
    assert f"LOOP_POLICY_DOWN={Exit.POLICY_DOWN.value}" in loop
    assert f"elif ((rc == {Exit.NOTHING_TO_TRAIN.value})); then # python -m training: too little data" in loop
    cases = dict(re.findall(r"^    (\d)\)(.*?);;", nodes[nodes.index("nodes_exit() {") :], re.M | re.S))
    assert "another rank failed" in cases[str(Exit.RANK_FAILED.value)]
    assert "asked to stop" in cases[str(Exit.RUN_STOPPED.value)]
    assert "evicted" in cases[str(Exit.EVICTED.value)]
    assert "the run finished" in cases[str(Exit.RUN_FINISHED.value)]


def test_docs_list_every_code():
    docs = (ROOT / "docs/cli.md").read_text()
    table = docs[docs.index("## Exit codes") : docs.index("## Environment")]
    rows = {int(code) for cell in re.findall(r"^\| ([\d /]+) \|", table, re.M) for code in cell.split(" / ")}
    assert {member.value for member in Exit} <= rows, "docs/cli.md#exit-codes lacks rows"
