"""Fencing by run id (issue 24, bug 7): once a newer multi-node run started on the log path, a node of the older
one appends no trajectory and no metrics.jsonl record there; a process of the current run does, and so does
every process without a run id (a single node)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine import fence
from rollout_engine.errors import BatonError
from rollout_engine.journal import Journal
from rollout_engine.layout import Layout
from rollout_engine.metrics import save_metrics
from rollout_engine.types import Trajectory


def start_run(log: Path, run_id: str) -> Path:
    """run.json as a master's start writes it (only the field the fence reads matters here)."""
    record = Layout(log).run_record
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"run_id": run_id}))
    return record


def episode(n: int) -> Trajectory:
    return Trajectory(f"t{n}#0", f"t{n}", 0, "train", 1, 1, "echo", "f", 1)


def test_a_node_of_a_superseded_run_appends_nothing_to_the_log_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    now = [1000.0]
    monkeypatch.setattr(fence, "clock", lambda: now[0])
    monkeypatch.setattr(fence, "_verified", None)
    monkeypatch.setenv("BATON_RUN_FENCE", str(start_run(log, "old")))
    monkeypatch.setenv("BATON_RUN_ID", "old")
    journal = Journal(Layout(log).journal("train", 1, rank=1), resume=False)
    journal.append(episode(0))  # the node's own run: written
    save_metrics(log / "metrics.jsonl", {"kind": "rollout", "iteration": 1})
    start_run(log, "new")  # a new master's start: the old run's node lives on (its heartbeat dead)
    now[0] += fence.FENCE_S  # the verdict that its run was current ran out: it reads the record again
    with pytest.raises(BatonError, match="run old was superseded by run new on this log path"):
        journal.append(episode(1))
    with pytest.raises(BatonError, match="run old was superseded by run new"):
        save_metrics(log / "metrics.jsonl", {"kind": "rollout", "iteration": 2})
    # the files show only the writes of the time the node's run was the log path's
    assert [json.loads(line)["episode_id"] for line in journal.path.read_text().splitlines()] == ["t0#0"]
    assert [json.loads(line)["iteration"] for line in (log / "metrics.jsonl").read_text().splitlines()] == [1]
    monkeypatch.setenv("BATON_RUN_ID", "new")  # a node of the new run writes
    journal.append(episode(2))
    monkeypatch.delenv("BATON_RUN_ID")  # a single node has no run id: nothing is fenced
    journal.append(episode(3))
    assert [json.loads(line)["episode_id"] for line in journal.path.read_text().splitlines()] == [
        "t0#0",
        "t2#0",
        "t3#0",
    ]


def test_the_run_record_is_read_at_most_every_fence_s_while_it_names_this_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append a second on every node read the run record each time (bench/fs_real.py: the most-opened file of
    a rolling-out worker); a promotion reads it every time."""
    log, now, reads = tmp_path / "log", [1000.0], []
    monkeypatch.setattr(fence, "clock", lambda: now[0])
    monkeypatch.setattr(fence, "_verified", None)
    real = fence.read_run_record
    monkeypatch.setattr(fence, "read_run_record", lambda path: reads.append(now[0]) or real(path))
    monkeypatch.setenv("BATON_RUN_FENCE", str(start_run(log, "run")))
    monkeypatch.setenv("BATON_RUN_ID", "run")
    journal = Journal(Layout(log).journal("train", 1, rank=1), resume=False)
    for n in range(4):  # four appends in 1.5 s: one read
        journal.append(episode(n))
        now[0] += 0.5
    assert reads == [1000.0]
    journal.append(episode(4))  # 2.0 s after the read
    fence.check_fence(fresh=True)
    assert reads == [1000.0, 1002.0, 1002.0]
