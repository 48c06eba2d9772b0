"""No import circle within a package: a module never imports, through others, itself.

Every .py file of rollout_engine, training and coordinator is parsed with `ast`;
an import counts wherever it is (inside a function too: a deferred import
only moves the circle to run time), except under `if TYPE_CHECKING:`, which
never runs. Only imports within the same package are followed (the layering
between packages is tests/unit/test_layering.py's).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollout_engine", "training", "coordinator")


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node under an `if TYPE_CHECKING:` block."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for child in node.body for inner in ast.walk(child)}
    return skipped


def imports_of(root: Path, path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that the file imports (`from pkg import mod` names the module mod)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in modules} - {module_name(root, path)}


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    paths = sorted((root / package).rglob("*.py"))
    modules = {module_name(root, p) for p in paths}
    return {module_name(root, p): imports_of(root, p, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of more than one module, as `a -> b -> a` paths."""
    found, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                done.add(node)
            elif child in path:
                found.append([*path[path.index(child) :], child])
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return found


def test_no_package_imports_in_a_circle():
    problems = [" -> ".join(c) for package in PACKAGES for c in circles(import_graph(ROOT, package))]
    assert not problems, "import circles:\n" + "\n".join(problems)


def test_a_circle_through_a_deferred_import_is_named(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "__init__.py").write_text("")
    (tmp_path / "training" / "config.py").write_text("def f():\n    from training.demos import check\n")
    (tmp_path / "training" / "demos.py").write_text("from training import config\n")
    (tmp_path / "training" / "hints.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from training.config import X\n"
    )

    assert circles(import_graph(tmp_path, "training")) == [["training.config", "training.demos", "training.config"]]
