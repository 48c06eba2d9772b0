"""Loading journals for an update: a multi-rank iteration only once the master has merged it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.aggregate import aggregate
from rollout_engine import shared_read
from rollout_engine.errors import ConfigError
from rollout_engine.history import load_trajectories
from rollout_engine.journal import Journal
from rollout_engine.layout import takeover_journal_name
from rollout_engine.takeover import (
    DeadRank,
    TakeoverPlan,
    cut_journal,
    save_takeover_plan,
    takeover_plan_path,
)
from tests.unit.training.trajectories import traj


@pytest.fixture(autouse=True)
def no_wait_for_a_stale_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sealed file that reads short (a journal changed on purpose here) or a rank's record that is missing (these
    ranks write none) is read again for SEALED_WAIT_S on a shared filesystem; here not at all
    (tests/unit/rollout_engine/test_files.py and tests/unit/coordinator/test_aggregate.py test the waits)."""
    monkeypatch.setattr(shared_read, "SEALED_WAIT_S", 0.0)


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


def test_a_merged_iteration_reads_every_rank_the_manifest_names_whatever_a_stale_listing_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshfs lists a folder up to 20 s late: the master's listing may lack a worker's journal it has merged."""
    roll_out(tmp_path, 0, ["a", "b"])
    roll_out(tmp_path, 1, ["c"])
    aggregate(tmp_path, "train", 1, num_nodes=2, wall_s=1.0)
    real_glob = Path.glob
    monkeypatch.setattr(
        Path, "glob", lambda self, pattern: (p for p in real_glob(self, pattern) if "rank_1" not in p.name)
    )
    assert sorted(t.episode_id for t in load_trajectories(tmp_path, "train", [1])) == ["a#0", "b#0", "c#0"]


def test_a_single_rank_iteration_needs_no_merge(tmp_path: Path) -> None:
    roll_out(tmp_path, 0, ["a"])
    assert [t.episode_id for t in load_trajectories(tmp_path, "train", [1])] == ["a#0"]


def test_a_taken_over_iteration_is_read_as_its_manifest_says_each_episode_once(tmp_path: Path) -> None:
    """Rank 1 died after journaling d (and half of e); ranks 0 and 2 took over e and f."""
    directory = tmp_path / "trajectories" / "train" / "iter_0001"
    roll_out(tmp_path, 0, ["a", "b"])
    roll_out(tmp_path, 2, ["c"])
    dead = Journal(directory / "rank_1.jsonl", resume=False)
    dead.append(traj("d", 0, success=True, iteration=1))
    with dead.path.open("a") as handle:
        handle.write(json.dumps(traj("e", 0, success=True, iteration=1).to_json())[:60])
    cut = cut_journal(dead.path)
    plan = TakeoverPlan("train", 1, [1.0, 1.0, 1.0], {1: DeadRank(cut, 3, {0: ["e#0"], 2: ["f#0"]})})
    save_takeover_plan(takeover_plan_path(directory), plan)
    for rank, task in ((0, "e"), (2, "f")):
        journal = Journal(directory / takeover_journal_name(rank, 1), resume=False)
        journal.append(traj(task, 0, success=True, iteration=1))
        journal.seal(planned=1)
    dead.append(traj("e", 0, success=False, iteration=1))  # the evicted rank went on: after the cut
    with pytest.raises(ConfigError, match=r"holds takeover journals \(rank_0.takeover_1.jsonl, rank_2.takeover_1"):
        load_trajectories(tmp_path, "train", [1])
    aggregate(tmp_path, "train", 1, num_nodes=3, wall_s=1.0, takeover_plan=takeover_plan_path(directory))
    loaded = load_trajectories(tmp_path, "train", [1])
    assert sorted(t.episode_id for t in loaded) == ["a#0", "b#0", "c#0", "d#0", "e#0", "f#0"]
    assert all(t.success for t in loaded)  # e#0 is the survivor's, not what the dead rank wrote after its cut
    taken = directory / takeover_journal_name(2, 1)
    taken.write_text(taken.read_text() + json.dumps(traj("a", 0, success=True, iteration=1).to_json()) + "\n")
    aggregate(tmp_path, "train", 1, num_nodes=3, wall_s=1.0, takeover_plan=takeover_plan_path(directory))
    with pytest.raises(ConfigError, match=r"takeover of ranks 1 is not complete \(rank_2.takeover_1.jsonl; dup"):
        load_trajectories(tmp_path, "train", [1])
