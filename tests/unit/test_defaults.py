"""The driver, Bash and the docs agree with the one table of defaults (rollout_engine/defaults.py).

The driver (coordinator/driver/) reads each setting of the table through it (`Setting.value`, or the
Setting's own `env` and `default`), never by spelling the variable's name or its number itself. scripts/
cannot import the table, so every `${BATON_X:-N}` there for a setting of the table must be its default,
and docs/cli.md's environment table must say the same number.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rollout_engine.defaults as defaults_module
from rollout_engine.defaults import SETTINGS, Setting

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "coordinator" / "driver"
SPELLING = re.compile(r"\$\{(BATON_[A-Z_]+):-([^}]*)\}")
#: the module-level names of the table's settings (VLLM_START_S, ...)
SETTING_NAMES = {name for name, value in vars(defaults_module).items() if isinstance(value, Setting)}
#: the BATON_ variables the driver may name itself: none is a number with a default
DRIVER_VARIABLES = {
    "BATON_APP_PY",
    "BATON_DEVICE",
    "BATON_DRIVER_HANDOFF",
    "BATON_NODE_ADDR",
    "BATON_NODE_FILE",
    "BATON_RUN_FENCE",
    "BATON_RUN_ID",
    "BATON_SERVE_PY",
    "BATON_TRAIN_BIN",
    "BATON_TRAIN_PY",
    "BATON_VLLM_DTYPE",
}


def driver_spellings(source: str, where: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The ("where:line", "BATON_X") of every string constant naming a BATON_ variable in `source`, and the
    "where:line X.default" of every use of a table setting's default (which ignores the variable)."""
    names, defaults = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"BATON_\w+", node.value):
            names.append((f"{where}:{node.lineno}", node.value))
        if isinstance(node, ast.Attribute) and node.attr == "default":
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            if owner in SETTING_NAMES:
                defaults.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return names, defaults


def driver_sources() -> list[tuple[str, str]]:
    return [(path.read_text(), str(path.relative_to(ROOT))) for path in sorted(DRIVER.glob("*.py"))]


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
        "BATON_TEST_LONG",
        "BATON_TRACE",
        "BATON_VLLM_DTYPE",
    }, "a new numeric default belongs in rollout_engine/defaults.py"


def test_the_driver_reads_the_table_s_settings_through_it():
    table = {s.env for s in SETTINGS}
    names, defaults = [], []
    for source, where in driver_sources():
        found, used = driver_spellings(source, where)
        names += found
        defaults += used
    spelled = [
        f"{where}: {env} (read it as rollout_engine.defaults' Setting: .value())"
        for where, env in names
        if env in table
    ]
    assert not spelled, "\n".join(spelled)
    assert not defaults, "the driver must honour the variable (Setting.value()):\n" + "\n".join(defaults)
    unknown = sorted({f"{where}: {env}" for where, env in names if env not in DRIVER_VARIABLES})
    assert not unknown, "a new numeric default belongs in rollout_engine/defaults.py:\n" + "\n".join(unknown)


def test_the_check_finds_a_spelled_setting_and_an_ignored_variable():
    source = (
        'x = os.environ.get("BATON_VLLM_START_S", "600")\ny = defaults.VLLM_START_S.default + VLLM_RELOAD_S.default\n'
    )
    names, defaults = driver_spellings(source, "probe")
    assert names == [("probe:1", "BATON_VLLM_START_S")]
    assert sorted(defaults) == ["probe:2 VLLM_RELOAD_S.default", "probe:2 defaults.VLLM_START_S.default"]


def test_a_setting_s_value_is_its_variable_when_set_else_its_default():
    assert defaults_module.VLLM_START_S.value({}) == 600
    assert defaults_module.VLLM_START_S.value({"BATON_VLLM_START_S": " "}) == 600
    assert defaults_module.VLLM_START_S.value({"BATON_VLLM_START_S": "30"}) == 30


def test_docs_say_the_same_defaults():
    docs = (ROOT / "docs/cli.md").read_text()
    rows = dict(re.findall(r"^\| (`BATON_[^|]+) \| ([^|]*) \|", docs, re.M))
    said = {}
    for names, values in rows.items():
        for env, value in zip(re.findall(r"`(BATON_\w+)`", names), values.split(","), strict=False):
            said[env] = value.strip().split()[0] if value.strip() else ""
    for setting in SETTINGS:
        assert said.get(setting.env) == f"{setting.default:g}", f"docs/cli.md: {setting.env}"
