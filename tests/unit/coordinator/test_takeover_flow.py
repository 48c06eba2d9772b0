"""A rank dies mid-rollout and the survivors finish its share: plan, takeover rollouts, merge, the update's read.

Real rollouts (rollout_engine.runner) with a one-turn fake environment and a fake policy server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.aggregate import aggregate
from coordinator.reassign import plan_takeover
from rollout_engine.history import load_trajectories
from rollout_engine.journal import Journal
from rollout_engine.runner import run_rollout
from rollout_engine.takeover import takeover_plan_path
from rollout_engine.tasks import load_tasks, plan_rank
from rollout_engine.types import Trajectory
from tests.unit.rollout_engine.engine_fakes import rollout_config, use_fake_policy, write_tasks

WEIGHTS = [2.0, 1.0, 1.0]


async def test_every_planned_episode_is_trained_on_exactly_once_after_a_takeover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_policy(monkeypatch)
    write_tasks(tmp_path / "data", 16)
    tasks = load_tasks(tmp_path / "data" / "tasks.jsonl")
    planned = {r: [s.episode_id for s in plan_rank(tasks, rollout_config(tmp_path, r, WEIGHTS), r)] for r in range(3)}
    for survivor in (0, 2):
        assert await run_rollout(rollout_config(tmp_path, survivor, WEIGHTS), "own: share\n") == 0
    directory = tmp_path / "log" / "trajectories" / "train" / "iter_0002"
    dead = Journal(directory / "rank_1.jsonl", resume=False)  # rank 1 journaled one episode, then died
    task, sample = planned[1][0].split("#")
    dead.append(Trajectory(planned[1][0], task, int(sample), "train", 2, 1, "echo", "", 1, success=True))

    plan = plan_takeover(rollout_config(tmp_path, 0, WEIGHTS), dead=[1], survivors=[0, 2])
    assert plan.dead[1].assignments == {0: planned[1][1:3], 2: planned[1][3:]}
    for survivor in (0, 2):
        cfg = rollout_config(tmp_path, survivor, WEIGHTS, takeover_plan=str(takeover_plan_path(directory)))
        assert await run_rollout(cfg, "takeover: yes\n") == 0
    record = aggregate(tmp_path / "log", "train", 2, 3, wall_s=9.0, takeover_plan=takeover_plan_path(directory))

    manifest = json.loads((directory / "manifest.json").read_text())
    assert (manifest["episodes"], manifest["planned"], manifest["complete"]) == (16, 16, True)
    assert manifest["reassigned"] == {"1": {"0": 2, "2": 1}} and record["per_rank"]["0"]["episodes"] == 8
    loaded = load_trajectories(tmp_path / "log", "train", [2])
    assert sorted(t.episode_id for t in loaded) == sorted(e for ids in planned.values() for e in ids)
    assert {t.episode_id: t.rank for t in loaded}[planned[1][3]] == 2  # rolled out by the survivor


async def test_a_resume_after_an_interrupted_takeover_trains_on_every_episode_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24, bug 4: a takeover interrupted (rank 0 took over its part, rank 2 never did), then every node
    resumed: rank 1 finished its own share, nobody was lost, so the merge has no takeover plan. The takeover
    journals left behind are named superseded in the manifest, never read, and the update reads each planned
    episode once."""
    use_fake_policy(monkeypatch)
    write_tasks(tmp_path / "data", 16)
    tasks = load_tasks(tmp_path / "data" / "tasks.jsonl")
    planned = {r: [s.episode_id for s in plan_rank(tasks, rollout_config(tmp_path, r, WEIGHTS), r)] for r in range(3)}
    for survivor in (0, 2):
        assert await run_rollout(rollout_config(tmp_path, survivor, WEIGHTS), "own: share\n") == 0
    directory = tmp_path / "log" / "trajectories" / "train" / "iter_0002"
    dead = Journal(directory / "rank_1.jsonl", resume=False)
    task, sample = planned[1][0].split("#")
    dead.append(Trajectory(planned[1][0], task, int(sample), "train", 2, 1, "echo", "", 1, success=True))
    plan = plan_takeover(rollout_config(tmp_path, 0, WEIGHTS), dead=[1], survivors=[0, 2])
    cfg = rollout_config(tmp_path, 0, WEIGHTS, takeover_plan=str(takeover_plan_path(directory)))
    assert await run_rollout(cfg, "takeover: yes\n") == 0  # rank 0 took over its part; then the run stopped
    assert plan.dead[1].assignments[0] == planned[1][1:3]

    for rank in range(3):  # --resume on every node: each resumes its own journal
        assert await run_rollout(rollout_config(tmp_path, rank, WEIGHTS, resume=True), "own: share\n") == 0
    aggregate(tmp_path / "log", "train", 2, 3, wall_s=9.0)

    manifest = json.loads((directory / "manifest.json").read_text())
    assert (manifest["episodes"], manifest["planned"], manifest["complete"]) == (16, 16, True)
    loaded = load_trajectories(tmp_path / "log", "train", [2])
    assert sorted(t.episode_id for t in loaded) == sorted(e for ids in planned.values() for e in ids)
    assert {t.episode_id: t.rank for t in loaded}[planned[1][1]] == 1  # its own line, not the takeover's
    assert manifest["superseded"] == {
        "rank_0.takeover_1.jsonl": {"rank": 1, "episodes": 2, "reason": "rank 1's own journal is sealed complete"}
    }
