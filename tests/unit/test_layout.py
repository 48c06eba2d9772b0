"""The log path's layout has one owner, rollout_engine/layout.py.

Every .py file of the packages and bench is scanned: formatting an iteration
folder (`iter_%04d`, `f"iter_{n:04d}"`) or a policy version (`f"v{n:04d}"`),
or spelling a file name the layout owns, happens only in the owner. Tests may
spell literal paths (`iter_0002`): they pin the format on disk.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from coordinator import runstate
from rollout_engine.layout import Layout, iterations, manifest_name, parse_iteration, parse_journal_name, parse_version

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollout_engine", "training", "coordinator", "bench")
OWNER = Path("rollout_engine/layout.py")
#: standalone scripts that run without the repository on sys.path (a bare GPU machine's train environment)
STANDALONE = Path("bench/gpu")
#: iteration and version numbers formatted into a name
FORMATTING = re.compile(r"""iter_(\{|%0?4d)|["'/]v\{[^}]*:04d\}|["'/]v%04d""")
#: file names of the layout that are no one else's to spell (a whole string constant)
OWNED_NAMES = {"trajectories", "metrics.jsonl", "manifest.json", "takeover.json", "pinned.json", "status.json"}


def layout_spellings(root: Path) -> list[str]:
    """`file:line what` for every spelling of the layout outside its owner under `root`."""
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative == OWNER or STANDALONE in relative.parents:
                continue
            text = path.read_text()
            for number, line in enumerate(text.splitlines(), 1):
                if FORMATTING.search(line):
                    problems.append(f"{relative}:{number} formats {FORMATTING.search(line).group(0)!r}")
            tree = ast.parse(text, filename=str(path))
            keys = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in OWNED_NAMES and id(node) not in keys:
                    problems.append(f"{relative}:{node.lineno} spells {node.value!r}")
    return problems


def test_only_the_layout_spells_the_log_path():
    problems = layout_spellings(ROOT)
    assert not problems, "use rollout_engine.layout instead:\n" + "\n".join(problems)


def test_a_spelling_outside_the_owner_is_named(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "rollout_engine" / "layout.py").write_text('NAME = f"iter_{n:04d}"\n')
    (tmp_path / "training" / "x.py").write_text('a = f"iter_{n:04d}"\nb = "iter_%04d" % n\n')
    (tmp_path / "coordinator" / "y.py").write_text(
        'p = log / "policy" / f"v{version:04d}"\nq = log / "metrics.jsonl"\n'
    )

    assert layout_spellings(tmp_path) == [
        "training/x.py:1 formats 'iter_{'",
        "training/x.py:2 formats 'iter_%04d'",
        "coordinator/y.py:1 formats '\"v{version:04d}'",
        "coordinator/y.py:2 spells 'metrics.jsonl'",
    ]


def test_the_layout_matches_docs_formats(tmp_path):
    layout = Layout(str(tmp_path))
    assert layout.journal("train", 3, 1) == tmp_path / "trajectories/train/iter_0003/rank_1.jsonl"
    assert layout.merged_manifest("test", 12) == tmp_path / "trajectories/test/iter_0012/manifest.json"
    assert layout.takeover_plan("train", 3) == tmp_path / "trajectories/train/iter_0003/takeover.json"
    assert layout.marker(3, "update") == tmp_path / "run/state/iter_0003/update.done"
    assert layout.phase_log(0, 3, "update") == tmp_path / "run/rank_0/logs/iter_0003.update.log"
    assert layout.training_dir(10000) == tmp_path / "training/iter_10000"
    assert layout.policy_version(2) == tmp_path / "policy/v0002"
    assert layout.status() == tmp_path / "status.json" and layout.status(2) == tmp_path / "status.rank_2.json"
    assert layout.rank_metrics(1) == tmp_path / "metrics/rank_1.jsonl"
    assert layout.cluster_run("r1").barrier_dir(3, "update") == tmp_path / "cluster/runs/r1/barriers/iter_0003/update"
    assert layout.role("rollout").run_record == tmp_path / "roles/rollout/cluster/run.json"
    assert manifest_name("rank_1.takeover_2.jsonl") == "rank_1.takeover_2.manifest.json"


def test_names_parse_back():
    assert parse_iteration("iter_0007") == 7 and parse_iteration("iter_7x") is None
    assert parse_version("v0012") == 12 and parse_version("v12") is None and parse_version(".staging-v0001-9") is None
    assert parse_journal_name("rank_2.jsonl") == (2, None)
    assert parse_journal_name("rank_0.takeover_1.jsonl") == (0, 1)
    assert parse_journal_name("rank_0.manifest.json") is None and parse_journal_name("rank_0.jsonl.aside-1") is None


def test_iterations_lists_only_iteration_entries(tmp_path):
    assert iterations(tmp_path / "missing") == []
    for name in ("iter_0002", "iter_0010", "iter_x", "notes"):
        (tmp_path / name).mkdir()
    assert iterations(tmp_path) == [(2, tmp_path / "iter_0002"), (10, tmp_path / "iter_0010")]


def path_strings(path: Path) -> list[ast.Constant]:
    """The string constants of the module at `path`, its docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_driver_keeps_its_iteration_state_where_the_layout_says(tmp_path):
    """The driver marks phases through coordinator/runstate (Layout.state_dir), in the folder and files the Bash
    loop wrote (`<log>/run/state/iter_<NNNN>/<phase>.done`, `times`): a log path it left resumes; and no driver
    module spells that folder itself."""
    runstate.mark(tmp_path, 7, "update", "promoted v2")
    runstate.add_time(tmp_path, 7, "update", 12)
    assert Layout(tmp_path).state_dir(7) == tmp_path / "run/state/iter_0007"
    assert (tmp_path / "run/state/iter_0007/update.done").read_text() == "promoted v2\n"
    assert (tmp_path / "run/state/iter_0007/times").read_text() == "update 12\n"
    spelled = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in sorted((ROOT / "coordinator" / "driver").glob("*.py"))
        for node in path_strings(path)
        if node.value in ("state", "times") or "run/state" in node.value or node.value.endswith(".done")
    ]
    assert not spelled, "use Layout.state_dir / coordinator.runstate:\n" + "\n".join(spelled)
