"""The `runs` fixture: real `Run`s of one node on the test's log path (tests/unit/driver/fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.driver.fakes import Runs, clean_settings


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runs]:
    clean_settings(monkeypatch)
    made = Runs(tmp_path)
    yield made
    made.stop_all()
