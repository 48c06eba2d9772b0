"""bench/chaos_checks.py on canned log paths: exactly once (on one rank, and across several with a takeover),
the policy chain, iteration records, deadlines, and what a run left running (offline, fast)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench.chaos_checks import (
    check_deadlines,
    check_iteration,
    check_iteration_records,
    check_iterations_done,
    check_log,
    check_policy_chain,
    check_rejoined,
    check_rollout,
    leftover_processes,
    member_iterations,
    recorded_groups,
    start_time,
)
from coordinator import groupfile
from coordinator.aggregate import aggregate
from coordinator.reassign import plan_takeover
from rollout_engine.config import RolloutConfig
from rollout_engine.journal import Journal
from rollout_engine.layout import Layout, version_name
from rollout_engine.runner import run_rollout
from rollout_engine.takeover import takeover_plan_path
from rollout_engine.tasks import load_tasks, plan_rank
from rollout_engine.types import Trajectory
from tests.unit.rollout_engine.engine_fakes import rollout_config, use_fake_policy, write_tasks


def journal(log: Path, ids: list[str], planned: int | None, split: str = "train", iteration: int = 1) -> Path:
    """A rank-0 journal of `ids`, sealed with `planned` (None: unsealed)."""
    directory = Layout(log).iteration_dir(split, iteration)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "rank_0.jsonl"
    path.write_text("".join(json.dumps({"episode_id": i, "status": "ok"}) + "\n" for i in ids))
    if planned is not None:
        manifest = {
            "planned": planned,
            "episodes": len(ids),
            "complete": len(set(ids)) >= planned,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
        (directory / "rank_0.manifest.json").write_text(json.dumps(manifest))
    return path


def policy(
    log: Path, version: int, iteration: int, parent: int | None, done: str | None = None, **extra: object
) -> None:
    directory = Layout(log).policy_version(version)
    directory.mkdir(parents=True)
    (directory / "baton_policy.json").write_text(
        json.dumps({"version": version, "iteration": iteration, "parent": parent, **extra})
    )
    current = log / "policy" / "current"
    current.unlink(missing_ok=True)
    current.symlink_to(version_name(version))
    state = Layout(log).state_dir(iteration)
    state.mkdir(parents=True, exist_ok=True)
    (state / "update.done").write_text((done or f"promoted v{version}") + "\n")


def test_every_planned_episode_once_is_clean(tmp_path: Path) -> None:
    check = check_rollout(journal(tmp_path, ["a#0", "a#1", "b#0"], planned=3))
    assert (check.lost, check.duplicated, check.complete, check.verified) == (0, 0, True, True)
    assert check.problems() == []


def test_duplicates_lost_and_torn_lines_are_counted(tmp_path: Path) -> None:
    path = journal(tmp_path, ["a#0", "a#0", "b#0"], planned=4)
    check = check_rollout(path)
    assert (check.lost, check.duplicated, check.complete) == (2, 1, False)
    assert len(check.problems()) == 3
    with path.open("a") as out:
        out.write('{"episode_id": "c#')  # a torn last line is no episode, and the journal changed after its seal
    check = check_rollout(path)
    assert check.lines == 3 and not check.verified
    assert any("changed after it was sealed" in p for p in check.problems())


def test_an_unsealed_journal_and_asides_are_reported(tmp_path: Path) -> None:
    path = journal(tmp_path, ["a#0"], planned=None)
    (path.parent / "rank_0.jsonl.aside-20261124T000000Z").write_text("")
    check = check_rollout(path)
    assert check.planned is None and check.lost is None and check.asides == 1
    assert check.problems() == [f"{path}: not sealed (no manifest)"]


def test_a_chain_of_versions_is_clean(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        policy(tmp_path, version, iteration=version, parent=version - 1 or None)
    assert check_policy_chain(tmp_path) == []


def test_a_pruned_chain_starts_at_its_oldest_kept_version(tmp_path: Path) -> None:
    for version in (4, 5):
        policy(tmp_path, version, iteration=version + 1, parent=version - 1)
    assert check_policy_chain(tmp_path) == []


def test_a_keep_best_revert_is_a_version_of_the_chain_but_not_its_iterations_promotion(tmp_path: Path) -> None:
    policy(tmp_path, 1, iteration=1, parent=None, reverted_to=None)
    policy(tmp_path, 2, iteration=2, parent=1)
    policy(tmp_path, 3, iteration=3, parent=2, done="promoted v4", reverted_to=1)  # the revert, before the update
    policy(tmp_path, 4, iteration=3, parent=3)
    assert check_policy_chain(tmp_path) == []
    policy(tmp_path, 5, iteration=3, parent=4, done="promoted v4", reverted_to=7)
    problems = check_policy_chain(tmp_path)
    assert "v0005: reverted_to 7, expected an earlier version (0: the base model)" in problems
    assert "iterations reverted twice: [3]" in problems


def test_broken_chains_are_named(tmp_path: Path) -> None:
    policy(tmp_path, 1, iteration=1, parent=None)
    policy(tmp_path, 2, iteration=1, parent=None)  # iteration 1 promoted twice, parent not v1
    policy(tmp_path, 4, iteration=3, parent=2, done="skipped: too little to train on")
    problems = check_policy_chain(tmp_path)
    assert "v0002: parent None, expected 1" in problems
    assert "v0004: parent 2, expected 3" in problems
    assert "versions not consecutive: [1, 2, 4]" in problems
    assert "iterations promoted twice: [1]" in problems
    assert any(p.startswith("v0004 (iteration 3): update.done says") for p in problems)
    (tmp_path / "policy" / "current").unlink()
    (tmp_path / "policy" / "current").symlink_to("v0002")
    assert "policy/current is v0002, expected v0004" in check_policy_chain(tmp_path)


def test_an_iteration_recorded_twice_in_metrics(tmp_path: Path) -> None:
    rows = [
        {"kind": "rollout", "iteration": 1},
        {"kind": "iteration", "iteration": 1},
        {"kind": "iteration", "iteration": 2},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_iteration_records(tmp_path) == []
    with (tmp_path / "metrics.jsonl").open("a") as out:
        out.write(json.dumps({"kind": "iteration", "iteration": 2}) + "\n")
    assert check_iteration_records(tmp_path) == ["metrics.jsonl: iteration 2 recorded 2 times"]
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "training", "iteration": 2, "update_seq": 4}\n' * 2)
    assert check_iteration_records(tmp_path)[1:] == ["metrics.jsonl: the update's record 4 merged 2 times"]


def test_a_phase_past_its_deadline(tmp_path: Path) -> None:
    state = tmp_path / "run" / "state" / "iter_0002"
    state.mkdir(parents=True)
    (state / "times").write_text("train_rollout 12\nupdate 700\nserve 3\n")
    assert check_deadlines(tmp_path, {"update": 600, "train_rollout": 60}) == [
        "iteration 2: update took 700 s, past its deadline of 600 s"
    ]


def test_a_live_recorded_group_is_left_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    file = Layout(tmp_path).groups(0)
    file.parent.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        file.write_bytes(groupfile.encode({"rollout-train": groupfile.Record(child.pid, str(start_time(child.pid)))}))
        assert leftover_processes(tmp_path) == [f"group {child.pid} recorded in {file}:rollout-train"]
        # the pid names another process now
        file.write_bytes(groupfile.encode({"rollout-train": groupfile.Record(child.pid, "1")}))
        assert leftover_processes(tmp_path) == []
    finally:
        child.kill()
        child.wait()
    assert leftover_processes(tmp_path) == []


def test_a_process_naming_the_log_path_is_left(tmp_path: Path) -> None:
    marker = tmp_path / "exp"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(marker)])
    try:
        left = leftover_processes(marker)
        assert len(left) == 1 and left[0].startswith(f"pid {child.pid}:")
    finally:
        child.kill()
        child.wait()
    assert leftover_processes(marker) == [] and os.getpid()


def test_check_log_sums_and_lists_every_problem(tmp_path: Path) -> None:
    journal(tmp_path, ["a#0", "a#0"], planned=2)
    journal(tmp_path, ["t#0"], planned=1, split="test")
    report = check_log(tmp_path, processes=False)
    assert (report.lost, report.duplicated) == (1, 1)
    assert len(report.problems()) == 3  # lost, duplicated, not complete
    assert check_log(tmp_path, iterations=[2], processes=False).problems() == []


# ---- several ranks: real rollouts (the fake environment and policy of tests/unit/rollout_engine), merged ----

WEIGHTS = [1.0, 1.0]


def resolved(cfg: RolloutConfig) -> str:
    """The config as run.sh hands it to the engine (saved beside the journal: the check plans from it)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


async def two_ranks(root: Path, monkeypatch: pytest.MonkeyPatch, takeover: bool = False) -> Path:
    """Iteration 2 of 16 episodes on two ranks, merged by the master; with `takeover`, rank 1 journaled one
    episode and died, rank 0 took over the rest (--on-rank-failure continue)."""
    use_fake_policy(monkeypatch)
    write_tasks(root / "data", 16)
    directory = root / "log" / "trajectories" / "train" / "iter_0002"
    configs = [rollout_config(root, rank, WEIGHTS) for rank in (0, 1)]
    assert await run_rollout(configs[0], resolved(configs[0])) == 0
    if not takeover:
        assert await run_rollout(configs[1], resolved(configs[1])) == 0
        aggregate(root / "log", "train", 2, 2, wall_s=1.0)
        return directory
    first = plan_rank(load_tasks(root / "data" / "tasks.jsonl"), configs[1], 1)[0]
    dead = Journal(directory / "rank_1.jsonl", resume=False)
    dead.append(Trajectory(first.episode_id, first.task.task_id, first.sample_index, "train", 2, 1, "echo", "", 1))
    plan_takeover(configs[0], dead=[1], survivors=[0])
    cfg = rollout_config(root, 0, WEIGHTS, takeover_plan=str(takeover_plan_path(directory)))
    assert await run_rollout(cfg, resolved(cfg)) == 0
    aggregate(root / "log", "train", 2, 2, wall_s=1.0, takeover_plan=takeover_plan_path(directory))
    return directory


async def test_two_ranks_merged_are_every_planned_episode_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = await two_ranks(tmp_path, monkeypatch)
    check = check_iteration(directory)
    assert (check.planned, check.lines, check.lost, check.duplicated, check.unexpected) == (16, 16, 0, 0, 0)
    assert check.problems() == []
    report = check_log(tmp_path / "log", processes=False)
    assert report.rollouts == [] and len(report.iterations) == 1 and report.problems() == []


async def test_an_episode_on_two_ranks_is_a_duplicate_and_a_missing_merge_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = await two_ranks(tmp_path, monkeypatch)
    line = (directory / "rank_0.jsonl").read_text().splitlines()[0]
    with (directory / "rank_1.jsonl").open("a") as out:
        out.write(line + "\n")  # rank 0's episode journaled by rank 1 too (and rank 1's journal changed)
    (directory / "manifest.json").unlink()
    check = check_iteration(directory)
    assert (check.duplicated, check.lost) == (1, 0)
    assert check.problems() == [
        f"{directory}: 1 episodes duplicated across the ranks' journals",
        f"{directory}/rank_1.jsonl: not sealed, or changed since it was sealed",
        f"{directory}: not merged by the master (no manifest.json)",
    ]


async def test_a_lost_rank_journal_loses_its_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = await two_ranks(tmp_path, monkeypatch)
    (directory / "rank_1.jsonl").write_text("")  # rank 1's share never reached the log path
    check = check_iteration(directory)
    assert (check.lost, check.duplicated) == (8, 0)
    assert f"{directory}: 8 of 16 planned episodes lost (on no rank's line)" in check.problems()


async def test_a_takeover_counts_the_dead_rank_up_to_its_cut_and_the_takeover_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = await two_ranks(tmp_path, monkeypatch, takeover=True)
    assert (directory / "rank_0.takeover_1.jsonl").exists()
    check = check_iteration(directory)
    assert (check.planned, check.lines, check.lost, check.duplicated) == (16, 16, 0, 0)
    assert check.problems() == []
    # what the dead rank appended after its cut (it was alive after all) is not the iteration's data
    taken = (directory / "rank_0.takeover_1.jsonl").read_text().splitlines()[0]
    with (directory / "rank_1.jsonl").open("a") as out:
        out.write(taken + "\n")
    assert check_iteration(directory).problems() == []
    # a takeover journal lost: the episodes it held are lost
    (directory / "rank_0.takeover_1.jsonl").unlink()
    check = check_iteration(directory)
    assert check.lost == 7 and check.problems()[0] == f"{directory}: 7 of 16 planned episodes lost (on no rank's line)"
    # the dead rank's journal changed before its cut: its prefix no longer counts
    (directory / "rank_1.jsonl").write_text("")
    assert f"{directory}/rank_1.jsonl (up to its cut): not sealed, or changed since it was sealed" in (
        check_iteration(directory).problems()
    )


def test_every_node_s_training_groups_are_recorded_groups(tmp_path: Path) -> None:
    training = tmp_path / "training" / "iter_0001"
    training.mkdir(parents=True)
    (training / "train.log.pgid").write_text("101 5\n")
    (training / "train.rank_1.log.pgid").write_text("202 6\n")
    assert [(pgid, start) for _, pgid, start in recorded_groups(tmp_path)] == [(101, "5"), (202, "6")]


async def test_a_takeover_journal_superseded_after_a_resume_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted takeover, then every node resumed and rank 1 finished its own share: the master's merge
    names the takeover journal superseded, and its lines are no duplicates."""
    directory = await two_ranks(tmp_path, monkeypatch, takeover=True)
    (directory / "manifest.json").unlink()
    cfg = rollout_config(tmp_path, 1, WEIGHTS, resume=True)
    assert await run_rollout(cfg, resolved(cfg)) == 0
    aggregate(tmp_path / "log", "train", 2, 2, wall_s=1.0)
    check = check_iteration(directory)
    assert (check.planned, check.lines, check.lost, check.duplicated) == (16, 16, 0, 0)
    assert check.problems() == []


# ---- a worker restarted late (--on-rank-failure continue): a member of a later step, every iteration done ----


def rank_journal(log: Path, iteration: int, rank: int, ids: list[str], sealed: bool = True) -> None:
    """Rank `rank`'s own train journal of `iteration`, sealed complete (or not: a dead rank's)."""
    directory = Layout(log).iteration_dir("train", iteration)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank_{rank}.jsonl"
    path.write_text("".join(json.dumps({"episode_id": i, "status": "ok"}) + "\n" for i in ids))
    if sealed:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        manifest = {"planned": len(ids), "episodes": len(ids), "complete": True, "sha256": digest}
        (directory / f"rank_{rank}.manifest.json").write_text(json.dumps(manifest))


def test_a_worker_restarted_late_is_a_member_of_the_iteration_with_its_sealed_journal(tmp_path: Path) -> None:
    # iteration 3: rank 1 died mid-rollout (its journal never sealed), rank 0 took over its episodes;
    # iteration 4 planned without it; iteration 5: rank 1 a member again
    rank_journal(tmp_path, 3, 0, ["a#0"])
    rank_journal(tmp_path, 3, 1, ["b#0"], sealed=False)
    (Layout(tmp_path).iteration_dir("train", 3) / "rank_0.takeover_1.jsonl").write_text('{"episode_id": "b#1"}\n')
    rank_journal(tmp_path, 4, 0, ["a#0", "b#0"])
    rank_journal(tmp_path, 5, 0, ["a#0"])
    rank_journal(tmp_path, 5, 1, ["b#0"])
    assert member_iterations(tmp_path, 1) == [5] and member_iterations(tmp_path, 0) == [3, 4, 5]
    assert check_rejoined(tmp_path, 1, died_in=3, last=5) == []


def test_a_worker_that_never_rejoined_is_named(tmp_path: Path) -> None:
    rank_journal(tmp_path, 3, 1, ["b#0"], sealed=False)
    rank_journal(tmp_path, 4, 1, [])  # sealed but empty: no episode of it in the step
    rank_journal(tmp_path, 6, 1, ["b#0"])  # after the round's last iteration
    assert member_iterations(tmp_path, 1) == [6]
    assert check_rejoined(tmp_path, 1, died_in=3, last=5) == [
        "rank 1 did not rejoin: no sealed train journal of it in iterations 4..5 (it died in iteration 3); "
        "member of [6]"
    ]
    # a journal changed after it was sealed is no membership
    rank_journal(tmp_path, 5, 1, ["b#0"])
    assert check_rejoined(tmp_path, 1, died_in=3, last=5) == []
    with (Layout(tmp_path).iteration_dir("train", 5) / "rank_1.jsonl").open("a") as out:
        out.write('{"episode_id": "b#9"}\n')
    assert check_rejoined(tmp_path, 1, died_in=3, last=5) != []


def test_every_iteration_of_a_round_is_done(tmp_path: Path) -> None:
    for n in (3, 5):
        Layout(tmp_path).state_dir(n).mkdir(parents=True)
        Layout(tmp_path).marker(n, "iteration").write_text("")
    assert check_iterations_done(tmp_path, 3, 3) == []
    assert check_iterations_done(tmp_path, 3, 5) == ["iteration 4 not done (no run/state/iter_0004/iteration.done)"]
