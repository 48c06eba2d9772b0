"""Bash and the docs agree with the one table of defaults (rollout_engine/defaults.py).

scripts/ cannot import the table, so every `${BATON_X:-N}` there for a setting
of the table must be its default, and docs/cli.md's environment table must say
the same number.
"""

from __future__ import annotations

import re
from pathlib import Path

from rollout_engine.defaults import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
SPELLING = re.compile(r"\$\{(BATON_[A-Z_]+):-([^}]*)\}")


def bash_defaults(root: Path) -> list[tuple[str, str, str]]:
    """(file:line, variable, default) of every `${BATON_X:-default}` under scripts/."""
    found = []
    for path in sorted((root / "scripts").rglob("*.sh")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [(f"{path.relative_to(root)}:{number}", env, value) for env, value in SPELLING.findall(line)]
    return found


def test_bash_spells_the_table_s_defaults():
    table = {s.env: s.default for s in SETTINGS}
    wrong = [
        f"{where}: {env} defaults to {value!r}, the table says {table[env]:g}"
        for where, env, value in bash_defaults(ROOT)
        if env in table and value != f"{table[env]:g}"
    ]
    assert not wrong, "\n".join(wrong)
    spelled = {env for _, env, _ in bash_defaults(ROOT)}
    assert spelled <= {s.env for s in SETTINGS} | {
        "BATON_BASE_MODEL",
        "BATON_CHROMIUM",
        "BATON_DEVICE",
        "BATON_ENVS",
        "BATON_HOME",
        "BATON_NODE_ADDR",
        "BATON_NODE_FILE",
        "BATON_PYTEST_ARGS",
        "BATON_PYTHON",
        "BATON_QUICKSTART_DIR",
        "BATON_QUICKSTART_ITERATIONS",
        "BATON_REPO",
        "BATON_TRACE",
        "BATON_VLLM_DTYPE",
    }, "a new numeric default belongs in rollout_engine/defaults.py"


def test_docs_say_the_same_defaults():
    docs = (ROOT / "docs/cli.md").read_text()
    rows = dict(re.findall(r"^\| (`BATON_[^|]+) \| ([^|]*) \|", docs, re.M))
    said = {}
    for names, values in rows.items():
        for env, value in zip(re.findall(r"`(BATON_\w+)`", names), values.split(","), strict=False):
            said[env] = value.strip().split()[0] if value.strip() else ""
    for setting in SETTINGS:
        assert said.get(setting.env) == f"{setting.default:g}", f"docs/cli.md: {setting.env}"
