"""Counted filesystem calls under a stepped clock: the instruments of bench/fs_load.py.

    clock = SteppedClock()
    clock.install()                  # before importing the project: its `clock=time.monotonic` defaults bind to it
    counter = Counter(root)
    counter.install()
    with counter.counting():         # only calls on paths under `root` (and fd calls) made in this block
        ...
    counter.calls, counter.creates, counter.renames

A call is what a filesystem client sends the server for a name or an open file: open, stat, a listing, rename,
unlink, mkdir, fsync, fchmod, ftruncate, utime (reads and writes of an open file's bytes are not counted). A create
is an open or mkdir that makes a new name; a rename is os.replace / os.rename.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class Done(BaseException):
    """The stepped clock reached the end of a measured window (BaseException: no `except Exception` eats it)."""


class SteppedClock:
    """time.monotonic and time.sleep on a simulated clock: a sleep advances it at once and runs `hooks` (the
    other ranks' world: their beats, their arrivals); past `end` a sleep raises Done."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.end: float | None = None
        self.hooks: list[Callable[[float], None]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(float(seconds), 1e-3)
        for hook in list(self.hooks):
            hook(self.now)
        if self.end is not None and self.now >= self.end:
            raise Done

    def install(self) -> None:
        time.monotonic = self.monotonic  # type: ignore[assignment]
        time.sleep = self.sleep  # type: ignore[assignment]


_PATH_CALLS = ("stat", "lstat", "scandir", "listdir", "unlink", "remove", "rmdir", "utime")
_FD_CALLS = ("fsync", "fchmod", "fdatasync", "ftruncate")


class Counter:
    """Counts the calls on paths under `root` while `counting()`."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.on = False
        self.calls = self.creates = self.renames = 0

    def reset(self) -> tuple[int, int, int]:
        counts = (self.calls, self.creates, self.renames)
        self.calls = self.creates = self.renames = 0
        return counts

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        was, self.on = self.on, False
        try:
            yield
        finally:
            self.on = was

    def _ours(self, path: object) -> bool:
        if not self.on or isinstance(path, int):
            return False
        try:
            return os.fspath(path).startswith(self.root)  # type: ignore[arg-type]
        except TypeError:
            return False

    def install(self) -> None:
        real_stat = os.stat

        def exists(path: object) -> bool:
            try:
                real_stat(path)  # type: ignore[arg-type]
            except OSError:
                return False
            return True

        for name in _PATH_CALLS:
            self._wrap_path(name)
        for name in _FD_CALLS:
            self._wrap_fd(name)
        for name in ("replace", "rename"):
            real = getattr(os, name)

            def renamed(src, dst, *a, _real=real, **k):  # type: ignore[no-untyped-def]
                if self._ours(src):
                    self.calls += 1
                    self.renames += 1
                return _real(src, dst, *a, **k)

            setattr(os, name, renamed)
        real_open, real_mkdir, real_io_open = os.open, os.mkdir, io.open

        def os_open(path, flags, *a, **k):  # type: ignore[no-untyped-def]
            if self._ours(path):
                self.calls += 1
                if flags & os.O_CREAT and not exists(path):
                    self.creates += 1
            return real_open(path, flags, *a, **k)

        def mkdir(path, *a, **k):  # type: ignore[no-untyped-def]
            if self._ours(path):
                self.calls += 1
                if not exists(path):
                    self.creates += 1
            return real_mkdir(path, *a, **k)

        def open_(file, mode="r", *a, **k):  # type: ignore[no-untyped-def]
            if self._ours(file):
                self.calls += 1
                if any(c in mode for c in "wxa") and not exists(file):
                    self.creates += 1
            return real_io_open(file, mode, *a, **k)

        os.open, os.mkdir = os_open, mkdir  # type: ignore[assignment]
        io.open = builtins.open = open_  # type: ignore[assignment]

    def _wrap_path(self, name: str) -> None:
        real = getattr(os, name)

        def call(path=".", *a, _real=real, **k):  # type: ignore[no-untyped-def]
            if self._ours(path):
                self.calls += 1
            return _real(path, *a, **k)

        setattr(os, name, call)

    def _wrap_fd(self, name: str) -> None:
        real = getattr(os, name, None)
        if real is None:
            return

        def call(fd, *a, _real=real, **k):  # type: ignore[no-untyped-def]
            if self.on:
                self.calls += 1
            return _real(fd, *a, **k)

        setattr(os, name, call)
