"""Fixtures shared by every test: the environments' interpreters and a
prepared data path (default model + default tasks)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def baton_home() -> Path:
    return Path(os.environ.get("BATON_HOME", Path.home() / ".cache" / "baton"))


def env_python(name: str) -> str:
    """Interpreter of the app, serve or train environment (set up by setup.sh)."""
    script = f'source scripts/lib/common.sh; source scripts/lib/envs.sh; envs_python "{name}"'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail(f"environment {name!r} is not set up: {out.stderr.strip()} (run: bash scripts/setup.sh)")
    return out.stdout.strip()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """A data path with the default model and tasks, prepared once and cached."""
    path = Path(os.environ.get("BATON_TEST_DATA", baton_home() / "test-data"))
    subprocess.run(["bash", str(REPO / "scripts/prepare.sh"), "--data-path", str(path)], check=True, cwd=REPO)
    return path


@pytest.fixture(scope="session")
def model_dir(data_dir: Path) -> Path:
    return data_dir / "models" / "SmolLM2-135M-Instruct"


def default_sigint() -> None:
    """Popen preexec_fn: SIGINT as a terminal gives it. A test run started in the background (CI, nohup)
    inherits SIGINT as ignored, and bash cannot trap a signal ignored at its start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout, a `kill`) ends the session as Ctrl+C does: pytest then tears the fixtures
    down, so the servers they started (the session's vLLM) stop with the session instead of outliving it."""
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_deselected(items: list[pytest.Item]) -> None:
    """List the deselected tests for scripts/test.sh's tally (JUnit XML has no place for them): one
    `gpu|long|other <node id>` line each, appended to $BATON_TEST_REPORTS/pytest.deselected when that is set."""
    reports = os.environ.get("BATON_TEST_REPORTS")
    if not reports:
        return
    with open(Path(reports) / "pytest.deselected", "a") as out:
        for item in items:
            why = next((m for m in ("gpu", "long") if item.get_closest_marker(m)), "other")
            out.write(f"{why} {item.nodeid}\n")
