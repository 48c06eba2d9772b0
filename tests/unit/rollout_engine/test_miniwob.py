"""MiniWoB++ env without a browser: task rows, task checks and configuration errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine.context import RunContext
from rollout_engine.envs.browser import find_chromium
from rollout_engine.envs.miniwob import MiniWobEnv, build_tasks, find_task_pages
from rollout_engine.errors import ConfigError
from rollout_engine.types import Task


def _context(tmp_path: Path) -> RunContext:
    return RunContext(split="test", iteration=0, rank=0, seed=0, data_path=tmp_path, log_dir=tmp_path / "log")


def test_task_pages_are_found_without_importing_the_package() -> None:
    pages = find_task_pages()
    assert (pages / "click-test.html").is_file() and (pages / "enter-text.html").is_file()


def test_build_tasks_is_deterministic_and_names_page_and_seed() -> None:
    rows = build_tasks(["click-test", "enter-text"], 3, seed=5)
    assert rows == build_tasks(["click-test", "enter-text"], 3, seed=5)
    assert len(rows) == 6 and len({row["task_id"] for row in rows}) == 6
    assert [row["metadata"]["miniwob_task"] for row in rows] == ["click-test"] * 3 + ["enter-text"] * 3
    assert all(
        isinstance(row["metadata"]["seed"], int) and row["family"] == row["metadata"]["miniwob_task"] for row in rows
    )
    assert json.loads(json.dumps(rows)) == rows


def test_check_task_names_the_bad_field(tmp_path: Path) -> None:
    env = MiniWobEnv(context=_context(tmp_path))
    good = Task.from_json(build_tasks(["click-test"], 1, seed=0)[0])
    assert env.check_task(good) is None
    unknown = Task(task_id="x", task_name="x", metadata={"miniwob_task": "no-such-page", "seed": 1})
    assert "metadata.miniwob_task" in (env.check_task(unknown) or "")
    seedless = Task(task_id="y", task_name="y", metadata={"miniwob_task": "click-test"})
    assert "metadata.seed" in (env.check_task(seedless) or "")


def test_missing_chromium_is_a_config_error_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATON_CHROMIUM", raising=False)
    with pytest.raises(ConfigError, match=r"env\.chromium: no Chromium binary found .*set BATON_CHROMIUM"):
        MiniWobEnv(context=_context(tmp_path), chromium=str(tmp_path / "missing"))
    monkeypatch.setattr("rollout_engine.envs.browser.CHROMIUM_CANDIDATES", ())
    with pytest.raises(ConfigError, match=r"env\.chromium"):
        MiniWobEnv(context=_context(tmp_path))


def test_a_named_binary_that_is_missing_never_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_CHROMIUM", str(tmp_path / "nothing"))
    assert find_chromium() is None


def test_chromium_comes_from_the_variable_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "chromium"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("BATON_CHROMIUM", str(binary))
    assert find_chromium() == str(binary)
    assert find_chromium(explicit="/usr/bin/true") == "/usr/bin/true"


def test_bad_budget_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"env\.max_steps must be >= 1"):
        MiniWobEnv(context=_context(tmp_path), max_steps=0)


def test_an_unknown_observation_or_a_bad_viewport_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"env\.observation must be one of text, screenshot, both \(got 'image'\)"):
        MiniWobEnv(context=_context(tmp_path), observation="image")
    for bad in ([500], [50, 300], [500, "300"]):
        with pytest.raises(ConfigError, match=r"env\.viewport must be \[width, height\] in pixels"):
            MiniWobEnv(context=_context(tmp_path), viewport=bad)
    assert MiniWobEnv(context=_context(tmp_path), observation="both", viewport=[1280, 800]).viewport == (1280, 800)
