"""bench/fs_load.py at two sizes: a worker's filesystem calls per second must not grow with the number of nodes.

Every node but one is a worker, so a worker's load times N is the cluster's: one that grows with N (a reader of
every rank's files on each node: the terminal views did, 2N calls a second each) makes the cluster's N².
The harness runs the project's own protocol, view and heartbeat code under a stepped clock (bench/fs_count.py)
in a child process (the stepped clock replaces time.sleep and time.monotonic for the whole process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_workers_calls_per_second_do_not_grow_with_the_nodes(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "bench.fs_load", "--ranks", "4,48", "--wait", "20", "--json", str(out)]
    subprocess.run(
        cmd, cwd=ROOT, check=True, capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    figures = json.loads(out.read_text())
    few, many = figures["4"], figures["48"]
    assert set(few) == {"rollout", "barrier", "training", "join", "stop", "latency"}
    for phase in set(few) - {"latency"}:
        calls_few, calls_many = few[phase]["worker"][0], many[phase]["worker"][0]
        assert calls_few > 0, phase  # it counted something: the harness reached the code
        assert calls_many <= calls_few * 1.02 + 0.1, (phase, calls_few, calls_many)
    # creates and renames (a metadata server's costly operations) at most N/5 a second over the cluster: the
    # heartbeats and status files are rewritten in place (a create and a rename each write made 2.4N)
    for phase in ("rollout", "barrier", "training"):
        cluster = many[phase]["master"][1] + 47 * many[phase]["worker"][1]
        assert cluster <= 48 / 5, (phase, many[phase])
    # the master reads every rank, a worker's figure is not the master's
    assert many["barrier"]["master"][0] > few["barrier"]["master"][0]
    # and the waits still keep their goals: a barrier opens within 3 s of its last arrival, a dead rank is noticed
    # within dead_after_s (30) + 5 s of its last beat
    for n in ("4", "48"):
        to_master, to_worker, dead = figures[n]["latency"]
        assert to_master + to_worker <= 3.0 and dead <= 35.0, (n, figures[n]["latency"])
