"""Waiting without going blind: every wait of the driver ticks the run's watches.

A watch is a callable run every `poll_s` while the driver waits for anything (a phase's
process group, vLLM's start-up, a barrier, a sleep between polls for new data). It either
does its job (start a killed heartbeat again; stop the update when a training partner
failed) or raises `say.Ended` / `say.Die` to end the wait and the run. So a dead child, a
killed heartbeat or a dead peer is noticed in every phase, not only in some.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

T = TypeVar("T")

#: a child exited by deadline (`Supervisor.wait` with total_s / stall_s), as timeout(1) says
EXPIRED = 124


class Child(Protocol):
    def poll(self) -> int | None:
        """The child's exit code once it exited (128 + n when killed by signal n), else None."""


class Supervisor:
    def __init__(self, poll_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.poll_s = poll_s
        self.clock = clock
        self._watches: list[Callable[[], None]] = []
        #: why the last `wait` returned EXPIRED
        self.expired = ""

    def add(self, watch: Callable[[], None]) -> None:
        self._watches.append(watch)

    def remove(self, watch: Callable[[], None]) -> None:
        if watch in self._watches:
            self._watches.remove(watch)

    @contextmanager
    def watching(self, watch: Callable[[], None]) -> Iterator[None]:
        """`watch` ticks for the duration of the block only (e.g. a training's partners)."""
        self.add(watch)
        try:
            yield
        finally:
            self.remove(watch)

    def tick(self) -> None:
        for watch in list(self._watches):
            watch()

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, ticking the watches every poll."""
        end = self.clock() + seconds
        while True:
            self.tick()
            left = end - self.clock()
            if left <= 0:
                return
            time.sleep(min(self.poll_s, left))

    def wait(
        self,
        child: Child,
        *,
        total_s: float = 0,
        stall_s: float = 0,
        progress: Callable[[], object] | None = None,
    ) -> int:
        """The child's exit code; EXPIRED once it ran `total_s` seconds, or once `progress()` has not
        changed for `stall_s` seconds (0: no such deadline). The caller stops the child then. `progress()` is
        looked at every stall_s / 30 (a rollout's is a listing on the shared filesystem: every poll on every
        node loaded it for a deadline of minutes)."""
        start = last = looked = self.clock()
        seen = progress() if progress is not None else None
        look_s = max(self.poll_s, stall_s / 30)
        while True:
            code = child.poll()
            if code is not None:
                return code
            self.tick()
            now = self.clock()
            if progress is not None and now - looked >= look_s:
                looked, current = now, progress()
                if current != seen:
                    seen, last = current, now
            if total_s > 0 and now - start >= total_s:
                self.expired = f"still running after {total_s:g}s (its deadline)"
                return EXPIRED
            if stall_s > 0 and progress is not None and now - last >= stall_s:
                self.expired = f"no progress for {stall_s:g}s (no episode finished; BATON_ROLLOUT_STALL_S)"
                return EXPIRED
            time.sleep(self.poll_s)

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()`, run in a thread while the watches tick here: a blocking call (an HTTP request to vLLM that
        may take minutes, a reload) does not blind the run. What `fn` raises is raised here."""
        box: dict[str, object] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        while thread.is_alive():
            self.tick()
            thread.join(self.poll_s)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]
