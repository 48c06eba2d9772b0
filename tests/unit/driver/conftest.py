"""Fixtures of the driver's unit tests: `runs`, real `Run`s of one node on the test's log path
(tests/unit/driver/fakes.py); a run directory, its `Groups`, and processes started outside them."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.driver.procs import Groups
from tests.unit.driver.fakes import Runs, clean_settings


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runs]:
    clean_settings(monkeypatch)
    made = Runs(tmp_path)
    yield made
    made.stop_all()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def groups(run_dir: Path) -> Iterator[Groups]:
    """A Groups of the test's run directory; whatever it still records is stopped afterwards."""
    groups = Groups(run_dir)
    yield groups
    for name in sorted(groups.records()):
        groups.stop(name, 2)


@pytest.fixture
def outsiders() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start processes the code under test did not start (killed afterwards, by pid)."""
    started: list[subprocess.Popen] = []

    def spawn(*cmd: str, new_session: bool = False) -> subprocess.Popen:
        started.append(subprocess.Popen(list(cmd), start_new_session=new_session))
        return started[-1]

    yield spawn
    for proc in started:
        proc.kill()
        proc.wait()
