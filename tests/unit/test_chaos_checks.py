"""bench/chaos_checks.py on canned log paths: exactly once, the policy chain, iteration records,
deadlines, and what a run left running (offline, fast)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.chaos_checks import (
    check_deadlines,
    check_iteration_records,
    check_log,
    check_policy_chain,
    check_rollout,
    leftover_processes,
    start_time,
)


def journal(log: Path, ids: list[str], planned: int | None, split: str = "train", iteration: int = 1) -> Path:
    """A rank-0 journal of `ids`, sealed with `planned` (None: unsealed)."""
    directory = log / "trajectories" / split / f"iter_{iteration:04d}"
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


def policy(log: Path, version: int, iteration: int, parent: int | None, done: str | None = None) -> None:
    directory = log / "policy" / f"v{version:04d}"
    directory.mkdir(parents=True)
    (directory / "baton_policy.json").write_text(
        json.dumps({"version": version, "iteration": iteration, "parent": parent})
    )
    current = log / "policy" / "current"
    current.unlink(missing_ok=True)
    current.symlink_to(f"v{version:04d}")
    state = log / "run" / "state" / f"iter_{iteration:04d}"
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


def test_a_phase_past_its_deadline(tmp_path: Path) -> None:
    state = tmp_path / "run" / "state" / "iter_0002"
    state.mkdir(parents=True)
    (state / "times").write_text("train_rollout 12\nupdate 700\nserve 3\n")
    assert check_deadlines(tmp_path, {"update": 600, "train_rollout": 60}) == [
        "iteration 2: update took 700 s, past its deadline of 600 s"
    ]


def test_a_live_recorded_group_is_left_and_a_reused_pid_is_not(tmp_path: Path) -> None:
    pids = tmp_path / "run" / "rank_0" / "pids"
    pids.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (pids / "rollout-train.pgid").write_text(f"{child.pid} {start_time(child.pid)}\n")
        assert leftover_processes(tmp_path) == [f"group {child.pid} recorded in {pids / 'rollout-train.pgid'}"]
        (pids / "rollout-train.pgid").write_text(f"{child.pid} 1\n")  # the pid names another process now
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
