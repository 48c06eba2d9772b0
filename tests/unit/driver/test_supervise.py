"""The driver's waits: a child's exit code, the deadlines, and the watches ticking in every wait."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

from coordinator.driver.say import Die
from coordinator.driver.supervise import EXPIRED, Supervisor


class Popen:
    """A real child, with the driver's exit-code convention (killed by signal n: 128 + n)."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    def poll(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)


def test_wait_returns_the_childs_own_exit_code_and_ticks_meanwhile() -> None:
    ticks: list[float] = []
    supervisor = Supervisor(poll_s=0.05)
    supervisor.add(lambda: ticks.append(time.monotonic()))
    assert supervisor.wait(Popen("import time, sys; time.sleep(0.5); sys.exit(7)")) == 7
    assert len(ticks) >= 5


def test_a_child_killed_by_a_signal_is_128_plus_its_number() -> None:
    child = Popen("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert Supervisor(poll_s=0.05).wait(child) == 137


def test_no_progress_for_stall_s_expires_and_says_so() -> None:
    supervisor = Supervisor(poll_s=0.05)
    child = Popen("import time; time.sleep(30)")
    start = time.monotonic()
    assert supervisor.wait(child, stall_s=0.5, progress=lambda: "same") == EXPIRED
    assert time.monotonic() - start < 5
    assert "no progress for 0.5s" in supervisor.expired
    child.proc.kill()


def test_progress_keeps_a_child_alive_past_stall_s_but_not_past_total_s() -> None:
    supervisor = Supervisor(poll_s=0.05)
    child = Popen("import time; time.sleep(30)")
    counter = iter(range(10**6))
    start = time.monotonic()
    assert supervisor.wait(child, total_s=1.0, stall_s=0.3, progress=lambda: next(counter)) == EXPIRED
    assert time.monotonic() - start >= 1.0
    assert "still running after 1s" in supervisor.expired
    child.proc.kill()


def test_progress_is_looked_at_a_thirtieth_of_stall_s_apart_not_every_poll() -> None:
    """A rollout's progress is a listing of its journals on the shared filesystem: every poll (0.5 s) on every
    node was a few calls a second each for a deadline of minutes (BATON_ROLLOUT_STALL_S, 900 s)."""
    supervisor = Supervisor(poll_s=0.02)
    child = Popen("import time; time.sleep(1.0)")
    looks: list[float] = []
    assert supervisor.wait(child, stall_s=9.0, progress=lambda: looks.append(time.monotonic())) == 0
    # every poll (0.02 s) would be 50 looks in 1 s; a thirtieth of stall_s keeps them 0.3 s apart
    assert len(looks) >= 2 and all(b - a >= 0.3 for a, b in itertools.pairwise(looks)), looks


def test_a_watch_that_raises_ends_the_wait_at_once() -> None:
    supervisor = Supervisor(poll_s=0.05)
    child = Popen("import time; time.sleep(30)")
    deadline = time.monotonic() + 0.3

    def peer_died() -> None:
        if time.monotonic() > deadline:
            raise Die(1, "rank 1 is dead")

    supervisor.add(peer_died)
    with pytest.raises(Die, match="rank 1 is dead"):
        supervisor.wait(child)
    child.proc.kill()


def test_call_runs_a_blocking_call_while_the_watches_tick_and_hands_back_its_result_or_error() -> None:
    supervisor = Supervisor(poll_s=0.05)
    ticks: list[int] = []
    supervisor.add(lambda: ticks.append(1))
    assert supervisor.call(lambda: (time.sleep(0.4), 42)[1]) == 42
    assert len(ticks) >= 4
    with pytest.raises(ValueError, match="refused"):
        supervisor.call(lambda: (_ for _ in ()).throw(ValueError("refused")))


def test_watching_adds_a_watch_for_the_block_only() -> None:
    supervisor = Supervisor(poll_s=0.01)
    seen: list[int] = []
    with supervisor.watching(lambda: seen.append(1)):
        supervisor.sleep(0.05)
    count = len(seen)
    supervisor.sleep(0.05)
    assert count >= 1 and len(seen) == count
