"""Imports between Baton's packages run one way: coordinator -> training -> rollout_engine.

rollout_engine imports neither training nor coordinator; training may import
rollout_engine but not coordinator; coordinator may import both. Every .py file
of the three packages is parsed with `ast` (imports inside functions count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the packages each package must not import
FORBIDDEN = {
    "rollout_engine": {"training", "coordinator"},
    "training": {"coordinator"},
    "coordinator": set(),
}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every absolute import in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def layering_violations(root: Path) -> list[str]:
    """`file:line imports module` for every import against FORBIDDEN under `root`."""
    problems = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in imported_modules(tree):
                if module.split(".")[0] in forbidden:
                    problems.append(f"{path.relative_to(root)}:{line} imports {module} ({package} must not)")
    return problems


def test_packages_import_one_way():
    problems = layering_violations(ROOT)
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_a_backward_import_is_named(tmp_path):
    for package in FORBIDDEN:
        (tmp_path / package).mkdir()
    (tmp_path / "rollout_engine" / "runner.py").write_text("def f():\n    from training.config import validate\n")
    (tmp_path / "training" / "update.py").write_text("import coordinator.summary\nimport rollout_engine.files\n")
    (tmp_path / "coordinator" / "plot.py").write_text("import training\nfrom rollout_engine import files\n")

    assert layering_violations(tmp_path) == [
        "rollout_engine/runner.py:2 imports training.config (rollout_engine must not)",
        "training/update.py:1 imports coordinator.summary (training must not)",
    ]
