"""Every package our modules import at module level is declared in the app environment's extras.

The app environment imports every module of rollout_engine, coordinator, training and bench (the unit tests
do), so a package that is only there as another one's dependency works by luck until that dependency drops it
(httpx was one). Imports inside functions (torch, llamafactory: the train environment's) are not checked.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("rollout_engine", "coordinator", "training", "bench", "tests/unit")
OURS = {"rollout_engine", "coordinator", "training", "bench", "tests", "__future__"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def app_extras(pyproject: dict) -> set[str]:
    """The distributions of the extras the app environment's steps install."""
    extras = pyproject["project"]["optional-dependencies"]
    steps = pyproject["tool"]["baton"]["envs"]["app"]["steps"]
    names = [step.split()[1] for step in steps if step.startswith("extra ")]
    return {normalize(re.split(r"[=<>!~\[; ]", req, maxsplit=1)[0]) for name in names for req in extras[name]}


def module_level_imports(path: Path) -> set[str]:
    """Top-level names imported by the statements at module level (in `try`/`if` blocks there too)."""
    found: set[str] = set()
    stack = list(ast.parse(path.read_text(), filename=str(path)).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try):
            stack += [*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])]
        elif isinstance(node, ast.ExceptHandler):
            stack += node.body
    return found


def undeclared(declared: set[str]) -> list[str]:
    owners = packages_distributions()
    problems = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module in sorted(module_level_imports(path) - OURS - set(sys.stdlib_module_names)):
                dists = {normalize(d) for d in owners.get(module, [])}
                if not dists & declared:
                    owner = ", ".join(sorted(dists)) or "none"
                    problems.append(f"{path.relative_to(ROOT)} imports {module} (distribution: {owner})")
    return problems


def test_every_module_level_import_is_declared_in_the_app_extras() -> None:
    problems = undeclared(app_extras(tomllib.loads((ROOT / "pyproject.toml").read_text())))
    assert not problems, "declare these in pyproject.toml's app extra (and rerun scripts/lock.sh app):\n" + "\n".join(
        problems
    )


def test_an_undeclared_import_is_named() -> None:
    declared = app_extras(tomllib.loads((ROOT / "pyproject.toml").read_text())) - {"httpx"}
    assert any(
        p.startswith("tests/unit/rollout_engine/test_policy_retry.py imports httpx") for p in undeclared(declared)
    )
