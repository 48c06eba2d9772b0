"""The master's merge of a multi-node rollout: one manifest, one metrics record from every rank's journal."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.aggregate import aggregate, rank_metrics_path
from rollout_engine.files import append_jsonl, save_json
from rollout_engine.journal import Journal
from rollout_engine.metrics import compute_metrics
from rollout_engine.types import Trajectory


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
