"""Journal: torn lines skipped (a torn tail cut on resume), bad rows refused, old journals moved aside, manifest."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from rollout_engine.errors import ConfigError
from rollout_engine.journal import Journal, load_manifest, read_journal
from rollout_engine.types import Trajectory, Turn


def traj(i: int) -> Trajectory:
    return Trajectory(
        episode_id=f"t{i}#0",
        task_id=f"t{i}",
        sample_index=0,
        split="train",
        iteration=0,
        rank=0,
        env="e",
        family="f",
        difficulty=1,
        turns=[Turn(index=0, messages=[], response=str(i))],
    )


def test_torn_last_line_is_dropped_and_truncated_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    journal = Journal(path, resume=False)
    journal.append(traj(1))
    journal.append(traj(2))
    with path.open("a") as handle:
        handle.write(json.dumps(traj(3).to_json())[:40])  # crash mid-write
    assert [t.episode_id for t in read_journal(path)] == ["t1#0", "t2#0"]
    resumed = Journal(path, resume=True)
    assert resumed.done_ids == {"t1#0", "t2#0"}
    assert path.read_bytes().endswith(b"\n")
    resumed.append(traj(3))
    assert [t.episode_id for t in read_journal(path)] == ["t1#0", "t2#0", "t3#0"]


def test_a_torn_middle_line_is_skipped_alone(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    torn = json.dumps(traj(2).to_json())[:40]
    path.write_text(json.dumps(traj(1).to_json()) + "\n" + torn + "\n" + json.dumps(traj(3).to_json()) + "\n")
    assert [t.episode_id for t in read_journal(path)] == ["t1#0", "t3#0"]


def test_a_json_line_that_is_not_a_trajectory_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    path.write_text(json.dumps(traj(1).to_json()) + '\n{"episode_id": "x"}\n' + json.dumps(traj(2).to_json()) + "\n")
    with pytest.raises(ConfigError, match=r"rank_0\.jsonl:2 is not a baton\.trajectory/1 line"):
        read_journal(path)


def test_without_resume_old_journal_is_moved_aside_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    Journal(path, resume=False).append(traj(1))
    original = path.read_bytes()
    fresh = Journal(path, resume=False)
    assert fresh.done == [] and not path.exists()
    (aside,) = tmp_path.glob("rank_0.jsonl.aside-*")
    assert aside.read_bytes() == original


def test_seal_writes_counts_and_checksum(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "rank_0.jsonl"
    journal = Journal(path, resume=False)
    journal.append(traj(1))
    manifest = journal.seal(planned=2)
    on_disk = json.loads((tmp_path / "rank_0.manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["episodes"] == 1 and manifest["complete"] is False and manifest["by_status"] == {"ok": 1}
    assert manifest["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_cancelled_write_finishes_and_seal_refuses_while_one_is_in_flight(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    class SlowJournal(Journal):
        def append(self, trajectory: Trajectory) -> None:
            started.set()
            release.wait(5)
            super().append(trajectory)

    journal = SlowJournal(tmp_path / "rank_0.jsonl", resume=False)
    write = asyncio.create_task(journal.write(traj(1)))
    while not started.is_set():
        await asyncio.sleep(0.01)
    write.cancel()
    await asyncio.sleep(0.05)
    assert not write.done()  # the cancellation waits for the write
    with pytest.raises(RuntimeError, match="in flight"):
        journal.seal(planned=1)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert journal.seal(planned=1)["episodes"] == 1


def test_one_reader_of_manifests(tmp_path):
    path = tmp_path / "manifest.json"
    assert load_manifest(path) is None
    path.write_text('{"complete": true}')
    assert load_manifest(path) == {"complete": True}
    for bad in ("[1, 2]", '{"comp', "\xff\xfe"):
        path.write_text(bad)
        assert load_manifest(path, strict=False) is None
        with pytest.raises(ConfigError, match="is not a JSON object"):
            load_manifest(path)
