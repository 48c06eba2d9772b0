"""Task loading, samplers and the rank split: disjoint, complete, deterministic, proportional."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from rollout_engine.config import DifficultyBucket, EnvConfig, RolloutConfig
from rollout_engine.errors import ConfigError
from rollout_engine.journal import Journal
from rollout_engine.tasks import (
    cluster_shares,
    derive_seed,
    largest_remainder,
    load_tasks,
    plan_episodes,
    recent_rates,
    sample_tasks,
    scale_limit,
    split_for_rank,
)
from rollout_engine.types import Failure, Task
from tests.unit.training.trajectories import traj


def make_tasks(n: int) -> list[Task]:
    return [Task(task_id=f"t{i}", task_name=f"q{i}", difficulty=1 + i % 9) for i in range(n)]


@pytest.mark.parametrize("weights", [[1.0], [1, 1], [1, 2, 3], [0.5, 0.0, 2.5], [3, 1, 1, 1, 7]])
@pytest.mark.parametrize("n", [0, 1, 7, 50, 101])
def test_split_is_disjoint_complete_deterministic_proportional(weights: list[float], n: int) -> None:
    tasks = make_tasks(n)
    shares = [split_for_rank(tasks, weights, r) for r in range(len(weights))]
    ids = [t.task_id for share in shares for t in share]
    assert sorted(ids) == sorted(t.task_id for t in tasks)  # complete
    assert len(ids) == len(set(ids))  # disjoint
    assert shares == [split_for_rank(tasks, weights, r) for r in range(len(weights))]  # deterministic
    for share, w in zip(shares, weights, strict=True):
        assert abs(len(share) - n * w / sum(weights)) < 1  # proportional within one task


def test_largest_remainder_sums_exactly() -> None:
    rng = random.Random(3)
    for _ in range(200):
        weights = [rng.random() for _ in range(rng.randint(1, 6))]
        total = rng.randint(0, 500)
        assert sum(largest_remainder(total, weights)) == total


def test_train_sampling_reproducible_per_iteration_and_split() -> None:
    tasks, cfg = make_tasks(100), EnvConfig(train_tasks_rollout_size=10)
    first = sample_tasks(tasks, cfg, "train", derive_seed(0, 3, "train"))
    assert first == sample_tasks(tasks, cfg, "train", derive_seed(0, 3, "train"))
    assert first != sample_tasks(tasks, cfg, "train", derive_seed(0, 4, "train"))
    assert len({t.task_id for t in first}) == 10


def test_ratio_sampler_follows_bucket_weights() -> None:
    cfg = EnvConfig(
        train_tasks_rollout_size=30,
        train_tasks_sampler="ratio",
        difficulty_ratio={"easy": DifficultyBucket(1, 3, 2.0), "hard": DifficultyBucket(7, 9, 1.0)},
    )
    chosen = sample_tasks(make_tasks(300), cfg, "train", 7)
    assert sum(t.difficulty <= 3 for t in chosen) == 20
    assert sum(t.difficulty >= 7 for t in chosen) == 10


def family_tasks(counts: dict[str, int]) -> list[Task]:
    return [Task(task_id=f"{f}-{i}", task_name="q", family=f) for f, n in counts.items() for i in range(n)]


def test_learnable_sampler_draws_most_tasks_where_the_policy_sometimes_succeeds() -> None:
    tasks = family_tasks({"always": 100, "half": 100, "never": 100, "unseen": 100})
    rates = {"always": 1.0, "half": 0.5, "never": 0.0}
    cfg = EnvConfig(train_tasks_rollout_size=60, train_tasks_sampler="learnable")
    chosen = sample_tasks(tasks, cfg, "train", 7, rates)
    count = {f: sum(t.family == f for t in chosen) for f in ("always", "half", "never", "unseen")}
    # weights 0.05 : 0.30 : 0.05 : 0.30 (a family without a rate counts as p = 0.5): 4.3 : 25.7 : 4.3 : 25.7
    assert 18 <= count["half"] <= 33 and 18 <= count["unseen"] <= 33, count
    assert 1 <= count["always"] <= 10 and 1 <= count["never"] <= 10, count
    assert len({t.task_id for t in chosen}) == 60
    assert chosen == sample_tasks(tasks, cfg, "train", 7, rates)  # reproducible: resume and takeover rely on it
    uniform = sample_tasks(tasks, EnvConfig(train_tasks_rollout_size=60), "train", 7, rates)
    assert {f: sum(t.family == f for t in uniform) for f in count} != count  # only `learnable` reads the rates


def roll_out_families(log: Path, iteration: int, outcomes: dict[str, list[bool]]) -> None:
    journal = Journal(log / "trajectories" / "train" / f"iter_{iteration:04d}" / "rank_0.jsonl", resume=False)
    n = 0
    for family, results in outcomes.items():
        for success in results:
            journal.append(replace(traj(f"{family}-{n}", 0, success, iteration), family=family))
            n += 1
    journal.append(replace(traj("half-x", 0, False, iteration), family="half", status=Failure.ENV_ERROR))
    journal.seal(planned=n + 1)


def test_learnable_rates_are_the_last_window_of_train_rollouts_before_this_iteration(tmp_path: Path) -> None:
    roll_out_families(tmp_path, 0, {"half": [False] * 4})  # outside a window of 2 before iteration 3
    roll_out_families(tmp_path, 1, {"half": [True, False], "never": [False]})
    roll_out_families(tmp_path, 2, {"half": [True, False], "always": [True]})
    roll_out_families(tmp_path, 3, {"half": [True] * 4})  # this iteration's own rollout, resumed: not read
    env = EnvConfig(train_tasks_sampler="learnable", learnable_window=2)
    cfg = RolloutConfig(data_path="d", log_path=str(tmp_path), iteration=3, env_config=env, env={})
    # the env_error episode ran to no outcome: left out
    assert recent_rates(cfg) == {"half": 0.5, "never": 0.0, "always": 1.0}
    assert recent_rates(replace(cfg, iteration=0)) == {}  # the first iteration: no history, every family p = 0.5
    assert recent_rates(replace(cfg, env_config=EnvConfig())) is None
    assert recent_rates(replace(cfg, split="test")) is None


def test_test_split_takes_first_n_and_repeats() -> None:
    cfg = EnvConfig(test_tasks_rollout_size=3, test_tasks_repeat_times=2, hardest_first=False)
    chosen = sample_tasks(make_tasks(10), cfg, "test", 0)
    assert [t.task_id for t in chosen] == ["t0", "t1", "t2"]
    episodes = plan_episodes(chosen, cfg, "test")
    assert [e.episode_id for e in episodes] == ["t0#0", "t0#1", "t1#0", "t1#1", "t2#0", "t2#1"]


def test_greedy_held_out_rollouts_take_one_sample_per_task_and_train_keeps_its_samples() -> None:
    cfg = EnvConfig(n_samples_per_task=4, test_tasks_repeat_times=2, test_greedy=True, hardest_first=False)
    tasks = make_tasks(3)
    assert [e.episode_id for e in plan_episodes(tasks, cfg, "test")] == ["t0#0", "t1#0", "t2#0"]
    assert len(plan_episodes(tasks, cfg, "train")) == 12


def test_hardest_first_orders_by_difficulty() -> None:
    episodes = plan_episodes(make_tasks(9), EnvConfig(hardest_first=True), "train")
    assert [e.task.difficulty for e in episodes] == sorted((e.task.difficulty for e in episodes), reverse=True)


@pytest.mark.parametrize("weights", [[1.0], [1, 3], [2, 1], [1, 100], [0.5, 0.0, 2.5], [3, 1, 1, 1, 7]])
def test_node_limits_are_each_nodes_own_whatever_the_weights(weights: list[float]) -> None:
    for rank in range(len(weights)):
        assert scale_limit(16, weights, rank, "node", "server_size") == 16


@pytest.mark.parametrize(
    "weights", [[1.0], [1, 1], [1, 3], [2, 1], [1, 100], [0.5, 0.0, 2.5], [3, 1, 1, 1, 7], [1] * 8]
)
@pytest.mark.parametrize("total", [8, 9, 16, 33, 101])
def test_cluster_limits_share_the_total_exactly(weights: list[float], total: int) -> None:
    shares = [scale_limit(total, weights, r, "cluster", "max_vllm_sessions") for r in range(len(weights))]
    assert sum(shares) == total
    assert all(share >= 1 if w > 0 else share == 0 for share, w in zip(shares, weights, strict=True))
    assert cluster_shares(total, weights, "max_vllm_sessions") == shares


def test_cluster_limits_follow_the_weights_and_give_each_rank_at_least_one() -> None:
    assert [scale_limit(16, [1, 3], r, "cluster", "server_size") for r in (0, 1)] == [4, 12]
    assert cluster_shares(2, [1, 100], "server_size") == [1, 1]
    assert cluster_shares(4, [1, 1, 100], "server_size") == [1, 1, 2]


def test_a_cluster_limit_smaller_than_the_ranks_is_an_error_naming_field_value_and_fix() -> None:
    with pytest.raises(
        ConfigError, match=r"env_config.server_size must be >= 3 .*cluster \(got 2\).*limits_scope=node"
    ):
        cluster_shares(2, [1, 1, 1], "server_size")
    assert cluster_shares(2, [1, 0, 1], "server_size") == [1, 0, 1]  # a rank with weight 0 needs none


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_tasks_names_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"task_id": "a", "task_name": "x"})
    with pytest.raises(ConfigError, match=r"t\.jsonl:3 is not valid JSON"):
        load_tasks(write(tmp_path / "t.jsonl", [good, "", "{broken"]))
    with pytest.raises(ConfigError, match=r"t2\.jsonl:2 lacks the required field task_name"):
        load_tasks(write(tmp_path / "t2.jsonl", [good, json.dumps({"task_id": "b"})]))
    with pytest.raises(ConfigError, match=r"repeats task_id 'a'"):
        load_tasks(write(tmp_path / "t3.jsonl", [good, good]))
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_webgym_columns_kept_under_metadata(tmp_path: Path) -> None:
    row = {"task_id": 5, "task_name": "find", "website": "w.org", "evaluator_reference": ["f"], "difficulty": 4}
    (task,) = load_tasks(write(tmp_path / "w.jsonl", [json.dumps(row)]))
    assert task.task_id == "5" and task.metadata["website"] == "w.org" and task.difficulty == 4
