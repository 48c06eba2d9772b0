"""What every unit test gets: the process environment as it was before the test, afterwards.

Code under test exports variables for the processes it starts (a node's BATON_RUN_ID and BATON_RUN_FENCE,
which name a file in the test's own folder); monkeypatch undoes only what it set, so without this a later
test's appends would be fenced by a run record that is gone with the earlier test's folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        del os.environ[name]
    os.environ.update(before)
