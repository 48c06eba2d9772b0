"""The master's merge of a multi-node rollout: one manifest, one metrics record from every rank's journal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.aggregate import aggregate, rank_metrics_path
from rollout_engine import shared_read
from rollout_engine.files import append_jsonl, save_json
from rollout_engine.journal import Journal
from rollout_engine.layout import takeover_journal_name
from rollout_engine.metrics import compute_metrics
from rollout_engine.takeover import (
    DeadRank,
    TakeoverPlan,
    cut_journal,
    save_takeover_plan,
    takeover_plan_path,
)
from rollout_engine.types import Trajectory


@pytest.fixture(autouse=True)
def no_wait_for_a_stale_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal shorter than sealed is read again for SEALED_WAIT_S (a client keeping an old size): here, where
    the tests shorten journals on purpose, not at all (tests/unit/rollout_engine/test_files.py tests the wait)."""
    monkeypatch.setattr(shared_read, "SEALED_WAIT_S", 0.0)


def trajectory(episode: str, *, success: bool) -> Trajectory:
    return Trajectory(episode, f"t-{episode}", 0, "train", 2, 0, "reasoning_gym", "chain_sum", 1, success=success)


def write_rank(log: Path, rank: int, episodes: list[Trajectory], planned: int) -> None:
    directory = log / "trajectories" / "train" / "iter_0002"
    journal = Journal(directory / f"rank_{rank}.jsonl", resume=False)
    for t in episodes:
        journal.append(t)
    journal.seal(planned=planned)
    own = compute_metrics(episodes, 10.0, planned, 0) | {"split": "train", "iteration": 2, "rank": rank}
    append_jsonl(rank_metrics_path(log, rank), own | {"policy_version": 3, "complete": len(episodes) >= planned})


def test_the_merged_record_counts_every_rank_as_one_node_would(tmp_path: Path) -> None:
    rank0 = [trajectory(f"e{i}", success=i < 3) for i in range(4)]
    rank1 = [trajectory(f"f{i}", success=i < 1) for i in range(2)]
    write_rank(tmp_path, 0, rank0, 4)
    write_rank(tmp_path, 1, rank1, 2)
    record = aggregate(tmp_path, "train", 2, num_nodes=2, wall_s=20.0)
    single = compute_metrics(rank0 + rank1, 20.0, 6, 0)
    assert record["success_rate"] == single["success_rate"] == round(4 / 6, 4)
    assert (record["episodes"], record["planned"], record["complete"], record["rank"]) == (6, 6, True, None)
    assert record["per_rank"]["1"]["episodes"] == 2 and record["policy_version"] == 3
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["ranks"] == 2 and line["kind"] == "rollout"
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert manifest["episodes"] == 6 and set(manifest["ranks"]) == {"0", "1"}


def test_a_ranks_record_a_client_shows_late_is_waited_for_when_its_journal_is_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshfs keeps a file's size for 20 s: the master reads rank 1's metrics without the record the rank
    appended after sealing its journal, until the size catches up."""
    write_rank(tmp_path, 0, [trajectory("e0", success=True)], 1)
    write_rank(tmp_path, 1, [trajectory("f0", success=False)], 1)
    reads = []

    def stale_size(path: Path) -> bytes:
        if path == rank_metrics_path(tmp_path, 1):
            reads.append(path)
            if len(reads) <= 2:
                return b""  # the size this client kept: from before the rank's append
        return path.read_bytes()

    monkeypatch.setattr(shared_read, "SEALED_WAIT_S", 5.0)
    monkeypatch.setattr("coordinator.aggregate.read_fresh", stale_size)
    record = aggregate(tmp_path, "train", 2, num_nodes=2, wall_s=5.0)
    assert record["per_rank"]["1"] is not None and record["per_rank"]["1"]["episodes"] == 1
    assert len(reads) == 3


def test_a_rank_without_a_sealed_journal_makes_the_iteration_incomplete(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, [trajectory("e0", success=True)], 1)
    save_json(tmp_path / "unrelated.json", {})
    record = aggregate(tmp_path, "train", 2, num_nodes=2, wall_s=5.0)
    assert record["complete"] is False and record["per_rank"]["1"] is None
    assert record["episodes"] == 1


def test_a_journal_changed_after_its_seal_is_not_verified(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, [trajectory("e0", success=True)], 1)
    write_rank(tmp_path, 1, [trajectory("f0", success=False)], 1)
    journal = tmp_path / "trajectories/train/iter_0002/rank_1.jsonl"
    journal.write_text(journal.read_text() + journal.read_text().replace('"f0"', '"f1"'))
    record = aggregate(tmp_path, "train", 2, num_nodes=2, wall_s=5.0)
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert manifest["ranks"]["0"]["verified"] and not manifest["ranks"]["1"]["verified"]
    assert record["complete"] is False and manifest["complete"] is False


def takeover_iteration(log: Path, extra_for_rank_2: tuple[str, ...] = ()) -> Path:
    """Ranks 0 and 2 finished their own e*/g*; rank 1 died after journaling f0 (and half of f1); the survivors
    took over f1, f2 (rank 0) and f3 (rank 2). Returns the plan's path."""
    directory = log / "trajectories" / "train" / "iter_0002"
    write_rank(log, 0, [trajectory("e0", success=True), trajectory("e1", success=False)], 2)
    write_rank(log, 2, [trajectory("g0", success=True), trajectory("g1", success=True)], 2)
    dead = Journal(directory / "rank_1.jsonl", resume=False)
    dead.append(trajectory("f0", success=True))
    with dead.path.open("a") as handle:
        handle.write(json.dumps(trajectory("f1", success=True).to_json())[:50])
    plan = TakeoverPlan(
        "train", 2, [1.0, 1.0, 1.0], {1: DeadRank(cut_journal(dead.path), 4, {0: ["f1", "f2"], 2: ["f3"]})}
    )
    save_takeover_plan(takeover_plan_path(directory), plan)
    for rank, episodes in ((0, ("f1", "f2")), (2, ("f3", *extra_for_rank_2))):
        journal = Journal(directory / takeover_journal_name(rank, 1), resume=False)
        for episode in episodes:
            journal.append(trajectory(episode, success=episode != "f2"))
        journal.seal(planned=len(plan.dead[1].assignments[rank]))
        append_jsonl(
            rank_metrics_path(log, rank), {"kind": "rollout", "split": "train", "iteration": 2, "takeover_of": [1]}
        )
    dead.append(trajectory("f1", success=False))  # the evicted rank goes on after the cut: never counted
    return takeover_plan_path(directory)


def test_a_takeover_counts_the_cut_and_the_takeover_journals_each_episode_once(tmp_path: Path) -> None:
    plan = takeover_iteration(tmp_path)
    record = aggregate(tmp_path, "train", 2, num_nodes=3, wall_s=30.0, takeover_plan=plan)
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert (manifest["episodes"], manifest["planned"], manifest["complete"]) == (8, 8, True)
    assert manifest["missing_ranks"] == [1] and manifest["reassigned"] == {"1": {"0": 2, "2": 1}}
    assert manifest["cut"]["1"] | {"sha256": ""} == {
        "journal": "rank_1.jsonl",
        "lines": 1,
        "sha256": "",
        "episodes": 1,
        "verified": True,
    }
    assert manifest["takeovers"]["1"]["2"]["verified"] and manifest["ranks"]["1"] is None
    assert (manifest["duplicates"], manifest["missing"], manifest["unexpected"]) == ([], [], [])
    assert (record["episodes"], record["complete"], record["success_rate"]) == (8, True, round(6 / 8, 4))
    assert (
        record["missing_ranks"] == [1] and record["per_rank"]["0"]["episodes"] == 2
    )  # its own record, not the takeover's


def test_a_duplicate_or_a_missing_episode_makes_a_takeover_incomplete_and_is_listed(tmp_path: Path) -> None:
    plan = takeover_iteration(tmp_path, extra_for_rank_2=("f2", "e1"))
    aggregate(tmp_path, "train", 2, num_nodes=3, wall_s=30.0, takeover_plan=plan)
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert manifest["complete"] is False and manifest["duplicates"] == ["e1", "f2"]
    assert manifest["unexpected"] == ["e1", "f2"] and manifest["missing"] == []
    (tmp_path / "trajectories/train/iter_0002" / takeover_journal_name(2, 1)).write_text("")
    record = aggregate(tmp_path, "train", 2, num_nodes=3, wall_s=30.0, takeover_plan=plan)
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert manifest["missing"] == ["f3"] and manifest["duplicates"] == [] and record["complete"] is False
    assert manifest["takeovers"]["1"]["2"]["verified"] is False


def test_a_dead_journal_changed_before_its_cut_is_not_verified(tmp_path: Path) -> None:
    plan = takeover_iteration(tmp_path)
    dead = tmp_path / "trajectories/train/iter_0002/rank_1.jsonl"
    dead.write_text(dead.read_text().replace('"f0"', '"f9"', 1))
    aggregate(tmp_path, "train", 2, num_nodes=3, wall_s=30.0, takeover_plan=plan)
    manifest = json.loads((tmp_path / "trajectories/train/iter_0002/manifest.json").read_text())
    assert manifest["cut"]["1"]["verified"] is False and manifest["missing"] == ["f0"]
    assert manifest["complete"] is False
