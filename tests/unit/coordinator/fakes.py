"""Fakes for the protocol tests: heartbeats beating in threads, and a run left by an earlier master."""

from __future__ import annotations

import threading
import uuid
from dataclasses import asdict
from pathlib import Path

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
