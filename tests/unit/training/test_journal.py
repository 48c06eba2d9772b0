"""Loading journals for an update: a multi-rank iteration only once the master has merged it."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.aggregate import aggregate
from rollout_engine.errors import ConfigError
from rollout_engine.journal import Journal
from tests.unit.training.trajectories import traj
from training.journal import load_trajectories


def roll_out(log: Path, rank: int, ids: list[str]) -> Path:
    journal = Journal(log / "trajectories" / "train" / "iter_0001" / f"rank_{rank}.jsonl", resume=False)
    for episode in ids:
        journal.append(traj(episode, 0, success=True, iteration=1))
    journal.seal(planned=len(ids))
    return journal.path


def test_a_multi_rank_iteration_is_read_once_merged_and_refused_before_or_when_changed(tmp_path: Path) -> None:
    roll_out(tmp_path, 0, ["a", "b"])
    second = roll_out(tmp_path, 1, ["c"])
    with pytest.raises(ConfigError, match=r"holds the journals of 2 ranks but no manifest\.json"):
        load_trajectories(tmp_path, "train", [1])
    aggregate(tmp_path, "train", 1, num_nodes=2, wall_s=1.0)
    assert sorted(t.episode_id for t in load_trajectories(tmp_path, "train", [1])) == ["a#0", "b#0", "c#0"]
    second.write_text(second.read_text() + second.read_text())  # written to after its seal
    aggregate(tmp_path, "train", 1, num_nodes=2, wall_s=1.0)
    with pytest.raises(ConfigError, match="the journals of ranks 1 are missing, incomplete or changed"):
        load_trajectories(tmp_path, "train", [1])


def test_a_single_rank_iteration_needs_no_merge(tmp_path: Path) -> None:
    roll_out(tmp_path, 0, ["a"])
    assert [t.episode_id for t in load_trajectories(tmp_path, "train", [1])] == ["a#0"]
