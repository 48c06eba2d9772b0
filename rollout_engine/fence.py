"""Fencing by run id: once a newer multi-node run started on a log path, a node of an older one (its heartbeat
dead or late, so nothing stopped it yet) writes nothing more there (issue 24, bug 7).

    check_fence()   # raises StaleRun when this process belongs to a run the log path has left behind

run.sh exports, on every node of a multi-node run once it started or joined it, BATON_RUN_ID (its run) and
BATON_RUN_FENCE (the run record a new master's start rewrites: `<log>/cluster/run.json`, or a split
deployment's `<log>/roles/<group>/cluster/run.json`) to every process it starts. The shared appends
(trajectory journals, metrics.jsonl: `rollout_engine.files`) and the policy's promotion check it first.
Without BATON_RUN_ID (a single node, a tool run by hand) nothing is fenced. It is read at each call, not at
import: importing this module does no work.
"""

from __future__ import annotations

import json
import os

from rollout_engine.errors import InfraError
from rollout_engine.shared_read import read_fresh

RUN_ID_VAR = "BATON_RUN_ID"
FENCE_VAR = "BATON_RUN_FENCE"


class StaleRun(InfraError):
    """This process's run is no longer the log path's: its write is refused."""


def read_run_record(path: str | os.PathLike[str]) -> dict:
    """The run record's JSON (`<log>/cluster/run.json`): its one reader (coordinator.cluster.load_run builds its
    RunRecord from this). OSError / ValueError when it cannot be read or parsed."""
    data = json.loads(read_fresh(path).decode("utf-8"))  # a newer master's start replaces it by rename
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no JSON object")
    return data


def check_fence() -> None:
    """Raise StaleRun when BATON_RUN_ID is set and the run record names another run (or none can be read)."""
    run_id = os.environ.get(RUN_ID_VAR, "")
    if not run_id:
        return
    record = os.environ.get(FENCE_VAR, "")
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
