"""Group-relative advantages (training.advantages) and the grpo selector that gives them to every step."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from rollout_engine.types import Failure
from tests.unit.training.trajectories import traj, turn
from training.advantages import episode_return, group_advantages
from training.dataset import load_token_ids, save_dataset
from training.selection import GroupSelector


def test_advantages_are_rewards_normalised_within_the_group() -> None:
    # rewards 1, 0, 0, 0: mean 0.25, centred 0.75 / -0.25; sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert group_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    # partial scores keep their order and spacing: 0.2, 0.5, 0.8 -> -0.3, 0, 0.3 over std 0.3
    assert group_advantages([0.2, 0.5, 0.8]) == pytest.approx([-1.0, 0.0, 1.0], rel=1e-5)
    # Dr. GRPO: centred only
    assert group_advantages([1.0, 0.0, 0.0, 0.0], scale_by_std=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # no spread, nothing to learn: None (the selector drops and counts the group)
    assert group_advantages([1.0, 1.0, 1.0]) is None
    assert group_advantages([0.0, 0.0]) is None
    assert group_advantages([1.0]) is None


def test_the_return_is_the_environments_score_and_a_success_without_one_counts_one() -> None:
    scored = dataclasses.replace(traj("a", 0, False), reward=0.375)  # partial credit (reasoning-gym's scorer)
    assert episode_return(scored) == 0.375
    assert episode_return(dataclasses.replace(traj("a", 1, True), reward=0.0)) == 1.0
    assert episode_return(traj("a", 2, False)) == 0.0


def test_grpo_trains_every_step_of_successes_and_failures_and_counts_dropped_groups() -> None:
    two_steps = [turn(0, changed=False), turn(1)]  # an unchanged step is trained too: the policy produced it
    trajectories = [
        traj("a", 0, True, turns=two_steps),
        traj("a", 1, False),
        traj("a", 2, False),
        traj("a", 3, False, status=Failure.ENV_ERROR),  # infra failure: not a sample of the policy's
        traj("b", 0, True),  # b and c: every sample scored the same
        traj("b", 1, True),
        traj("c", 0, False),
        traj("c", 1, False),
        traj("d", 0, True, iteration=1),  # d: one task, two iterations = two groups of one: no spread in either
        traj("d", 1, False, iteration=0),
    ]
    selector = GroupSelector(last_k_iterations=2, skip_unchanged_steps=False)
    selection = selector.select(trajectories, iteration=1, cutoff_len=2048)
    rows = {s.source: s.advantage for s in selection.samples}
    # a: rewards 1, 0, 0: mean 1/3, std sqrt((4/9 + 2/9) / 2) = 0.5774
    high, low = (2 / 3) / math.sqrt(1 / 3), (-1 / 3) / math.sqrt(1 / 3)
    assert rows == pytest.approx({"a#0@0": high, "a#0@1": high, "a#1@0": low, "a#2@0": low}, rel=1e-5)
    assert selection.filtered == {"infra_failed": 1, "same_reward_groups": 4, "same_reward_episodes": 6}
    assert "same_reward_groups: 4" in selection.describe()


def test_no_group_dropped_is_said_as_zero() -> None:
    selection = GroupSelector().select([traj("a", 0, True), traj("a", 1, False)], iteration=0, cutoff_len=2048)
    assert selection.filtered == {"same_reward_groups": 0}
    assert [s.advantage for s in selection.samples] == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)], rel=1e-5)


def test_each_rows_advantage_is_written_beside_its_sampled_ids(tmp_path: Path) -> None:
    selection = GroupSelector().select([traj("a", 0, True), traj("a", 1, False)], iteration=0, cutoff_len=2048)
    files = save_dataset(selection.samples, tmp_path, "sft", seed=3)
    rows = json.loads((tmp_path / "train.json").read_text())
    ids = load_token_ids(tmp_path, "train")
    assert files.train_rows == len(rows) == len(ids) == 2
    assert {row["source"]: row["advantage"] for row in ids} == pytest.approx(
        {"a#0@0": math.sqrt(0.5), "a#1@0": -math.sqrt(0.5)}, rel=1e-5
    )
