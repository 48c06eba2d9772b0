"""Fakes for the protocol tests: heartbeats beating in threads, a run left by an earlier master, and a count of
the file operations a piece of the protocol makes."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from coordinator.cluster import Cluster, Endpoint, RunRecord
from coordinator.heartbeat import Beat, run_heartbeat, write_beat
from rollout_engine.files import save_json
from rollout_engine.layout import Layout


class Beaters:
    """Heartbeats in threads, every 0.02 s, stopped at the end of the test."""

    def __init__(self) -> None:
        self._stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(self, cluster: Cluster, rank: int) -> threading.Event:
        stop = threading.Event()
        args, kwargs = (cluster, rank, 0.02, stop.wait), {"host": "h", "pid": 1}
        thread = threading.Thread(target=run_heartbeat, args=args, kwargs=kwargs, daemon=True)
        thread.start()
        self._stops.append((stop, thread))
        return stop

    def stop_all(self) -> None:
        for stop, thread in self._stops:
            stop.set()
            thread.join(timeout=1)


def old_run(log: Path, *, host: str = "gone-host", pid: int = 999_999, dead_after_s: float = 0.2, **kw) -> RunRecord:
    """run.json and a frozen master heartbeat, as a master that died left them."""
    values = {"num_nodes": 2, "rank_weights": [1, 1], "torchrun_port": None, "start_iteration": 0}
    values |= {"on_rank_failure": "abort", **kw}
    values.update(run_id=uuid.uuid4().hex, created=0.0, master=Endpoint(host, "10.0.0.9", pid))
    record = RunRecord(heartbeat_interval_s=0.05, dead_after_s=dead_after_s, **values)
    cluster = Cluster(log, record.run_id)
    save_json(cluster.paths.record, asdict(record))
    save_json(Layout(log).run_record, asdict(record))
    write_beat(cluster, 0, Beat(41, 9e9, host, pid))
    return record


@contextlib.contextmanager
def file_operations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Within: every read, listing and lookup by name (Path.read_bytes, os.listdir, os.scandir, Path.exists),
    one entry per call, in the list yielded."""
    calls: list[str] = []

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(name)
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as patch:
        for owner, name in ((Path, "read_bytes"), (os, "listdir"), (os, "scandir"), (Path, "exists")):
            patch.setattr(owner, name, counted(name, getattr(owner, name)))
        yield calls
