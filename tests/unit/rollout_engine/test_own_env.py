"""An environment from outside the repository: docs/examples/my_envs, copied to a folder of its own.

Loaded by env_config.python_path as run.sh's driver checks it and a rollout builds it (build_env), played
with scripted policies through the episode loop and a whole rollout, its own tests run from the copy, and
the refusals: a target that cannot be imported, a class that is no Env, a folder that is not there.
(run.sh's dry run with it, and the refusals' exit 2: tests/shell/own_env.bats.)

    pytest tests/unit/rollout_engine/test_own_env.py -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rollout_engine import runner
from rollout_engine.build import build_env
from rollout_engine.config import EnvConfig, RolloutConfig, validate
from rollout_engine.errors import ConfigError
from rollout_engine.journal import read_journal
from rollout_engine.layout import Layout
from rollout_engine.runner import check_tasks, run_rollout
from rollout_engine.tasks import load_tasks
from rollout_engine.types import Completion, Message
from tests.unit.rollout_engine.test_config import BASE, composed

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "my_envs"
TARGET = "env._target_=my_envs.guess.GuessNumberEnv"


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example copied outside the repository (the folder that holds my_envs/); the import path and the
    imported modules as they were after the test."""
    assert not tmp_path.resolve().is_relative_to(REPO)
    folder = tmp_path / "elsewhere" / "my_envs"
    shutil.copytree(EXAMPLE, folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m == "my_envs" or m.startswith("my_envs.")]:
        monkeypatch.delitem(sys.modules, name)
    yield folder
    for name in [m for m in sys.modules if m == "my_envs" or m.startswith("my_envs.")]:
        del sys.modules[name]


def write_tasks(folder: Path, data: Path) -> None:
    """The example's task files under data/guess, written by its own generator."""
    subprocess.run(
        [sys.executable, "-m", "my_envs.tasks", str(data / "guess"), "--train", "12", "--test", "6"],
        cwd=folder,
        check=True,
        capture_output=True,
    )


class BinarySearchPolicy:
    """Stands in for rollout_engine.policy.PolicyClient: plays every episode by halving the range it reads
    from the chat (one client serves every episode, so it keeps no state of its own)."""

    def __init__(self, config: object, sessions: int, **_: object) -> None:
        self.config = config

    async def check_server(self) -> None:
        return None

    async def chat(self, messages: list[Message]) -> Completion:
        low, high = map(int, re.findall(r"from (\d+) to (\d+)", messages[0]["content"])[0])
        for guess, answer in zip(messages[1::2], messages[2::2], strict=True):
            number = int(guess["content"])
            low, high = (number + 1, high) if answer["content"] == "Higher." else (low, number - 1)
        return Completion(text=str((low + high) // 2), completion_tokens=1)

    async def close(self) -> None:
        return None


async def test_the_example_loads_by_its_folder_checks_its_tasks_and_plays(outside: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_tasks(outside, data)
    overrides = ["env=custom", TARGET, f"env_config.python_path=[{outside}]", "+env.max_guesses=6"]
    cfg = validate(composed("rollout_train", [*BASE, *overrides]))
    env = build_env(cfg)
    assert env.name == "guess" and Path(sys.modules[type(env).__module__].__file__).is_relative_to(outside)
    assert sys.path.index(str(outside)) == sys.path.index(str(REPO)) + 1  # after the repository: never shadows it
    tasks = load_tasks(data / "guess" / "train.jsonl")
    check_tasks(env, tasks, data / "guess" / "train.jsonl")
    for task in tasks:
        state, score = await env.run_episode(task, 0, await env.expert(task))
        assert score.success and 0.5 <= score.reward <= 1.0 and len(state.turns) <= 6, state.turns


async def test_a_rollout_of_the_example_from_a_folder_under_data_path(
    outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative folder is under data_path; the engine journals every episode, each a success."""
    data = tmp_path / "data"
    shutil.copytree(outside, data / "envs" / "my_envs")
    write_tasks(outside, data)
    monkeypatch.setattr(runner, "PolicyClient", BinarySearchPolicy)
    cfg = RolloutConfig(
        data_path=str(data),
        log_path=str(tmp_path / "log"),
        iteration=1,
        env_config=EnvConfig(
            train_tasks="guess/train.jsonl", train_tasks_rollout_size=0, live_view="off", python_path=["envs/my_envs"]
        ),
        env=OmegaConf.create({"_target_": "my_envs.guess.GuessNumberEnv", "max_guesses": 6}),
    )
    assert await run_rollout(cfg, "resolved: yaml\n") == 0
    journal = read_journal(Layout(cfg.log_path).journal("train", 1, 0))
    assert len(journal) == 12 and all(t.success and t.status == "ok" for t in journal)
    assert {t.family for t in journal} == {"guess-1-8", "guess-1-16", "guess-1-32"}


def test_the_example_s_own_tests_pass_from_the_copy(outside: Path) -> None:
    """What a user copies runs as it is: its tests, from its folder, with Baton on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5 passed" in done.stdout


def test_its_expert_writes_demonstrations_with_env_custom(outside: Path, tmp_path: Path) -> None:
    """A warm start for a model that never wins: `python -m rollout_engine.demonstrations --env custom`."""
    data = tmp_path / "data"
    write_tasks(outside, data)
    argv = ["--env", "custom", "--tasks", str(data / "guess" / "train.jsonl"), "--out", str(tmp_path / "demos")]
    argv += [TARGET, f"env_config.python_path=[{outside}]"]
    done = subprocess.run(
        [sys.executable, "-m", "rollout_engine.demonstrations", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "demos" / "demonstrations.json").read_text())
    assert (summary["episodes"], summary["kept"]) == (12, 12), summary


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            [TARGET],
            "env._target_ cannot be imported (got 'my_envs.guess.GuessNumberEnv': no module named 'my_envs'); "
            "put the folder that holds its package in env_config.python_path",
        ),
        (
            [TARGET, "env_config.python_path=[{t}/nowhere]"],
            "env_config.python_path[0] is not a folder (got '{t}/nowhere'); give the folder that holds",
        ),
        (
            [TARGET, "env_config.python_path=[nowhere]"],
            "env_config.python_path[0] is not a folder (got 'nowhere (under data_path: {t}/data/nowhere)')",
        ),
        (
            ["env._target_=my_envs.tasks.build_tasks", "env_config.python_path=[{o}]"],
            "env._target_ must name a class deriving from rollout_engine.envs.base.Env "
            "(got 'my_envs.tasks.build_tasks', a function)",
        ),
        (
            ["env._target_=my_envs.guess.GuessState", "env_config.python_path=[{o}]"],
            "env._target_ must name a class deriving from rollout_engine.envs.base.Env "
            "(got 'my_envs.guess.GuessState', a class that does not)",
        ),
        (
            ["env._target_=my_envs.guess.GuessEnv", "env_config.python_path=[{o}]"],
            "env._target_ names no class of module 'my_envs.guess' (got 'my_envs.guess.GuessEnv'); fix the "
            "spelling (its Env classes: GuessNumberEnv)",
        ),
        (
            ["env._target_=my_envs.gues.GuessNumberEnv", "env_config.python_path=[{o}]"],
            "env._target_ cannot be imported (got 'my_envs.gues.GuessNumberEnv': no module named 'my_envs.gues', "
            "though the package 'my_envs' is at {o}/my_envs); fix the spelling",
        ),
        (
            ["env._target_=my_envs.broken.BrokenEnv", "env_config.python_path=[{o}]"],
            "env._target_ cannot be imported (got 'my_envs.broken.BrokenEnv': importing 'my_envs.broken' raised "
            "NameError: name 'undefined_name' is not defined at {o}/my_envs/broken.py:2); fix the module",
        ),
        (
            ["env._target_=my_envs.guess.GuessNumberEnv", "env_config.python_path=[{o}]", "+env.max_guess=6"],
            "unexpected keyword argument 'max_guess'",
        ),
        (["env=custom"], "env._target_ must name the environment's class (got nothing)"),
    ],
    ids=[
        "unimportable",
        "folder-missing",
        "relative-folder-missing",
        "a-function",
        "not-an-env",
        "misspelt",
        "module-misspelt",
        "broken",
        "unknown-parameter",
        "custom-without-target",
    ],
)
def test_refusals_name_the_setting_the_value_and_the_fix(
    outside: Path, tmp_path: Path, overrides: list[str], named: str
) -> None:
    (outside / "my_envs" / "broken.py").write_text("# a bug at import\nundefined_name()\n")
    values = {"t": str(tmp_path), "o": str(outside)}
    base = [f"data_path={tmp_path / 'data'}", f"log_path={tmp_path / 'log'}", "env=custom"]
    with pytest.raises(ConfigError) as caught:
        build_env(validate(composed("rollout_train", [*base, *(o.format(**values) for o in overrides)])))
    (problem,) = caught.value.problems
    assert named.format(**values) in problem, problem
    assert not (tmp_path / "log").exists()


def test_a_parameter_added_to_env_goes_to_the_rollouts_only() -> None:
    """run.sh's routing: `+env.<key>` is a new key of the rollouts' env node, not of the update's config; a new
    key under the update's open mapping goes to the update; one beside a schema's fields is refused."""
    from coordinator.overrides import Request, route
    from rollout_engine.config import register_configs as register_rollout
    from training.config import register_configs as register_update

    register_rollout()
    register_update()
    given = ["env=custom", TARGET, "+env.max_guesses=6", "+algorithm.llamafactory_overrides.seed=1"]
    routed, problems = route(Request("/data", "/log", "/model", given))
    assert not problems and routed.rollout == given[:3] and routed.update == given[3:]
    routed, problems = route(Request("/data", "/log", "/model", [*given[:3], "+algorithm.max_gueses=1"]))
    assert len(problems) == 1 and "'algorithm' has no key 'max_gueses' and takes no new ones" in problems[0]


def test_a_task_the_example_refuses_names_the_task_and_the_fix(outside: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"task_id": "g1", "task_name": "?", "metadata": {"low": 1, "high": 8, "secret": 9}}))
    cfg = validate(composed("rollout_train", [*BASE, "env=custom", TARGET, f"env_config.python_path=[{outside}]"]))
    with pytest.raises(ConfigError) as caught:
        check_tasks(build_env(cfg), load_tasks(path), path)
    assert "task 'g1': guess tasks need whole numbers metadata.low <= secret <= high (got 1, 9, 8)" in str(caught.value)
