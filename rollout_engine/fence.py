"""Fencing by run id: once a newer multi-node run started on a log path, a node of an older one (its heartbeat
dead or late, so nothing stopped it yet) writes nothing more there (issue 24, bug 7).

    check_fence()   # raises StaleRun when this process belongs to a run the log path has left behind

run.sh exports, on every node of a multi-node run once it started or joined it, BATON_RUN_ID (its run) and
BATON_RUN_FENCE (the run record a new master's start rewrites: `<log>/cluster/run.json`, or a split
deployment's `<log>/roles/<group>/cluster/run.json`) to every process it starts. The shared appends
(trajectory journals, metrics.jsonl: `rollout_engine.files`) and the policy's promotion check it first.
Without BATON_RUN_ID (a single node, a tool run by hand) nothing is fenced. It is read at each call, not at
import: importing this module does no work.

A verdict that this process's run is current holds for FENCE_S (2 s) on a clock that counts a suspended process
or machine (CLOCK_BOOTTIME): an append a second on every node re-read the run record each time, the most-opened
file of a rolling-out worker (bench/fs_real.py). A superseded node thus stops appending within FENCE_S of the
new master's start, long before the new run's nodes append anything (they join, plan and start serving first);
a promotion re-reads it (`fresh=True`).
"""

from __future__ import annotations

import json
import os
import time

from rollout_engine.errors import InfraError
from rollout_engine.shared_read import read_fresh

RUN_ID_VAR = "BATON_RUN_ID"
FENCE_VAR = "BATON_RUN_FENCE"
#: how long a verdict that this process's run is current holds (s)
FENCE_S = 2.0
#: (run id, run record, clock) of the last verdict that the run is current
_verified: tuple[str, str, float] | None = None


def clock() -> float:
    """Seconds on a clock that goes on while the process or the machine is suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class StaleRun(InfraError):
    """This process's run is no longer the log path's: its write is refused."""


def read_run_record(path: str | os.PathLike[str]) -> dict:
    """The run record's JSON (`<log>/cluster/run.json`): its one reader (coordinator.cluster.load_run builds its
    RunRecord from this). OSError / ValueError when it cannot be read or parsed."""
    data = json.loads(read_fresh(path).decode("utf-8"))  # a newer master's start replaces it by rename
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no JSON object")
    return data


def check_fence(fresh: bool = False) -> None:
    """Raise StaleRun when BATON_RUN_ID is set and the run record names another run (or none can be read); read
    at most every FENCE_S while it names this one (`fresh`: read now)."""
    global _verified
    run_id = os.environ.get(RUN_ID_VAR, "")
    if not run_id:
        return
    record = os.environ.get(FENCE_VAR, "")
    now = clock()
    if not fresh and _verified is not None and _verified[:2] == (run_id, record) and now - _verified[2] < FENCE_S:
        return
    _verified = None
    try:
        current = read_run_record(record).get("run_id")
    except (OSError, ValueError) as exc:
        where = record or "(BATON_RUN_FENCE unset)"
        raise StaleRun(f"run {run_id}: cannot read the run record {where} ({exc})") from exc
    if current != run_id:
        raise StaleRun(
            f"run {run_id} was superseded by run {current} on this log path ({record}): "
            "a node of the older run writes nothing more there"
        )
    _verified = (run_id, record, now)
