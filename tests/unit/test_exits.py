"""The exit codes the driver acts on are the ones the Python entry points name (rollout_engine/exits.py).

The driver (coordinator/driver/) imports the table, so it compares a child's exit code with a name from
it, never with a number of its own (only 0, success, is spelled); the codes the run loop acts on are
checked by name in the module that acts on them. docs/cli.md's table lists every code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rollout_engine.exits import Exit, signal_exit

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "coordinator" / "driver"
#: driver module -> the codes it acts on, by name (what each module compares an exit code with)
ACTS_ON = {
    # the policy server stopped answering under a rollout (exit 75): restart vLLM, resume the rollout
    "rollout.py": {"POLICY_DOWN"},
    # python -m training: too little data (3) is recorded `skipped`; bad input (2) ends the run
    "update.py": {"NOTHING_TO_TRAIN", "BAD_INPUT"},
    # the protocol's outcomes (python -m coordinator's codes): another rank failed, asked to stop, evicted, done
    "nodes.py": {"RANK_FAILED", "RUN_STOPPED", "EVICTED", "RUN_FINISHED"},
}
#: names an exit code goes by in the driver
CODE_NAMES = {"code", "rc", "returncode", "exit_code"}
#: vllm.py compares its own wait's outcomes (0 ready, 1 past the deadline, 2 exited), no child's exit code
NOT_EXIT_CODES = {"vllm.py"}


def exit_names(path: Path) -> set[str]:
    """The X of every `Exit.X` in `path`."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Exit"
    }


def bare_codes(source: str, where: str) -> list[str]:
    """`where:line comparison` for every exit code compared (==, !=, in, not in) with a number other than 0."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(side, ast.Name) and side.id in CODE_NAMES for side in sides):
            continue
        numbers = [
            item.value
            for side in sides
            for item in (side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side])
            if isinstance(item, ast.Constant) and type(item.value) is int
        ]
        if any(number != 0 for number in numbers):
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_numbers_callers_rely_on():
    assert (Exit.OK, Exit.FAILED, Exit.BAD_INPUT) == (0, 1, 2)
    assert Exit.INTERNAL == Exit.NOTHING_TO_TRAIN == Exit.RANK_FAILED == Exit.NONE_SOLVED == 3
    assert (Exit.RUN_STOPPED, Exit.EVICTED, Exit.RUN_FINISHED, Exit.POLICY_DOWN) == (4, 5, 6, 75)
    assert (Exit.SIGINT, Exit.SIGTERM) == (130, 143) == (signal_exit(2), signal_exit(15))


@pytest.mark.parametrize("module", list(ACTS_ON))
def test_the_driver_acts_on_the_codes_by_their_names(module: str):
    path = DRIVER / module
    missing = ACTS_ON[module] - exit_names(path)
    assert not missing, f"coordinator/driver/{module} no longer acts on Exit.{', Exit.'.join(sorted(missing))}"
    assert ACTS_ON[module] <= set(Exit.__members__)


def test_the_driver_compares_exit_codes_with_names_not_numbers():
    wrong = [
        line
        for path in sorted(DRIVER.glob("*.py"))
        if path.name not in NOT_EXIT_CODES
        for line in bare_codes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not wrong, "compare with rollout_engine.exits.Exit's names:\n" + "\n".join(wrong)


def test_the_check_finds_a_bare_number_and_lets_0_and_names_pass():
    source = "if code == 75 or rc in (0, 3) or code == 0 or code == Exit.EVICTED or code > 128:\n    pass\n"
    assert bare_codes(source, "probe") == ["probe:1 code == 75", "probe:1 rc in (0, 3)"]


def test_docs_list_every_code():
    docs = (ROOT / "docs/cli.md").read_text()
    table = docs[docs.index("## Exit codes") : docs.index("## Environment")]
    rows = {int(code) for cell in re.findall(r"^\| ([\d /]+) \|", table, re.M) for code in cell.split(" / ")}
    assert {member.value for member in Exit} <= rows, "docs/cli.md#exit-codes lacks rows"
