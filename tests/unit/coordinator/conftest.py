"""The `beaters` fixture: heartbeats in threads, stopped when the test ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.coordinator.fakes import Beaters


@pytest.fixture
def beaters() -> Iterator[Beaters]:
    running = Beaters()
    yield running
    running.stop_all()
