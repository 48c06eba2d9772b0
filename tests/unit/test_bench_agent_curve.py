"""bench/agent_curve.py: disjoint held-out sets, demonstrations for some families only, the Wilson interval,
the per-policy tables of the arms, and the arms' last policies compared per seed and family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.agent_curve import (
    BENCHES,
    Sizes,
    build_split_tasks,
    demonstration_tasks,
    evaluations,
    held_set,
    report,
    trained_iterations,
    wilson,
)
from rollout_engine.layout import Layout
from rollout_engine.types import Trajectory


def _family(task_id: str) -> str:
    """mw-heldA-click-button-0003 -> click-button"""
    return task_id.split("-", 2)[2].rsplit("-", 1)[0]


def _log(path: Path, records: list[dict], journals: dict[int, list[tuple[str, bool]]]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"kind": "iteration", **r}) + "\n" for r in records))
    for iteration, episodes in journals.items():
        folder = Layout(path).iteration_dir("test", iteration)
        folder.mkdir(parents=True)
        lines = [
            Trajectory(f"{task}#0", task, 0, "test", iteration, 0, "miniwob", _family(task), 1, success=ok).to_json()
            for task, ok in episodes
        ]
        (folder / "rank_0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_held_out_sets_share_no_page_with_train_or_each_other() -> None:
    train, held = build_split_tasks("miniwob", Sizes(train=30, held=10))
    assert len(train) == 180 and len(held) == 120
    pages = {(r["metadata"]["miniwob_task"], r["metadata"]["seed"]) for r in train}
    held_pages = {(r["metadata"]["miniwob_task"], r["metadata"]["seed"]) for r in held}
    assert not pages & held_pages and len(held_pages) == 120
    assert [held_set(r["task_id"]) for r in held].count("A") == 60
    assert held_set(train[0]["task_id"]) == ""


def test_wilson_interval_brackets_the_rate() -> None:
    low, high = wilson(49, 60)
    assert low == pytest.approx(0.7008, abs=1e-3) and high == pytest.approx(0.8944, abs=1e-3)
    assert wilson(0, 60)[0] == 0.0 and wilson(0, 60)[1] == pytest.approx(0.0602, abs=1e-3)


def test_evaluations_count_steps_before_each_policy_and_split_the_held_out_sets(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "rl",
        [
            {"iteration": 1, "served_version": None, "eval_success_rate": 0.0, "training_steps": 16},
            {"iteration": 2, "served_version": 1, "eval_success_rate": 0.75, "training_steps": 4},
            {"iteration": 3, "served_version": 2, "eval_success_rate": None, "training_steps": 4},
        ],
        {
            1: [("mw-heldA-x-0000", False), ("mw-heldB-x-0000", False)],
            2: [("mw-heldA-x-0000", True), ("mw-heldA-x-0001", True), ("mw-heldB-x-0000", False)],
        },
    )
    rows = evaluations(log, "RL", 0, "base model")
    assert [(r.label, r.steps) for r in rows] == [("base model", 0), ("RL v1", 16)]
    assert rows[1].successes == {"A": 2, "B": 0} and rows[1].episodes == {"A": 2, "B": 1}
    assert rows[1].rate == pytest.approx(2 / 3)


def test_a_finished_held_out_rollout_of_an_unfinished_iteration_is_an_evaluation_of_the_last_policy(
    tmp_path: Path,
) -> None:
    """An arm stopped (or still running) after its iteration's held-out rollout: that evaluation of the policy
    it served counts, with every optimizer step before it; an unfinished held-out rollout does not."""
    log = _log(
        tmp_path / "grpo",
        [
            {"iteration": 1, "served_version": None, "eval_success_rate": 0.5, "training_steps": 4},
            {"iteration": 2, "served_version": 1, "eval_success_rate": 0.5, "training_steps": 4},
        ],
        {
            1: [("mw-heldA-x-0000", True), ("mw-heldA-x-0001", False)],
            2: [("mw-heldA-x-0000", True), ("mw-heldA-x-0001", False)],
            3: [("mw-heldA-x-0000", True), ("mw-heldA-x-0001", True)],
        },
    )
    sealed = {"kind": "rollout", "split": "test", "iteration": 3, "complete": True, "policy_version": 2}
    with (log / "metrics.jsonl").open("a") as out:
        out.write(json.dumps({"kind": "rollout", "split": "train", "iteration": 3, "complete": True}) + "\n")
        out.write(json.dumps({**sealed, "invalid_action_rate": 0.25}) + "\n")
    rows = evaluations(log, "grpo", 8, "warm start")
    assert [(r.label, r.steps, r.successes["A"], r.episodes["A"]) for r in rows] == [
        ("warm start", 8, 1, 2),
        ("grpo v1", 12, 1, 2),
        ("grpo v2", 16, 2, 2),
    ]
    assert rows[-1].invalid == 0.25
    # the same rollout still running: no evaluation yet
    text = (log / "metrics.jsonl").read_text().replace('"complete": true, "policy_version": 2', '"complete": false')
    (log / "metrics.jsonl").write_text(text)
    assert [r.label for r in evaluations(log, "grpo", 8, "warm start")] == ["warm start", "grpo v1"]


def test_open_bench_demonstrates_three_families_and_holds_out_every_family() -> None:
    train, held = build_split_tasks("miniwob-open")
    bench = BENCHES["miniwob-open"]
    assert len(held) == 10 * 24 and len(train) == 10 * 20
    demo = demonstration_tasks("miniwob-open", train)
    assert {r["family"] for r in demo} == {"click-test", "focus-text", "enter-text"} and len(demo) == 60
    assert {r["family"] for r in held} == set(bench.families)
    # the benches before it demonstrate every family
    assert demonstration_tasks("miniwob", build_split_tasks("miniwob", Sizes(train=2, held=1))[0]) != []
    assert all(BENCHES["miniwob"].has_demonstrations(f) for f in BENCHES["miniwob"].families)


def _seed(root: Path, rl_last: list[tuple[str, bool]], control_last: list[tuple[str, bool]]) -> Path:
    """<root>/warm (the base model evaluated, 16 steps), then one 4-step iteration of each arm from it."""
    warm = [("mw-heldA-click-test-0000", True), ("mw-heldA-click-button-0000", False)]
    _log(
        root / "warm",
        [{"iteration": 1, "served_version": None, "eval_success_rate": 0.0, "training_steps": 16}],
        {1: [("mw-heldA-click-test-0000", False)]},
    )
    for arm, last in (("rl", rl_last), ("control", control_last)):
        _log(
            root / arm,
            [
                {"iteration": 1, "served_version": None, "eval_success_rate": 0.5, "training_steps": 4},
                {"iteration": 2, "served_version": 1, "eval_success_rate": 0.5},
            ],
            {1: warm, 2: last},
        )
    return root


def test_report_compares_each_seeds_last_policies_pooled_and_per_family(tmp_path: Path) -> None:
    both = [("mw-heldB-click-test-0001", True), ("mw-heldB-click-button-0001", True)]
    demo_only = [("mw-heldB-click-test-0001", True), ("mw-heldB-click-button-0001", False)]
    seed1 = _seed(tmp_path / "seed1", both, demo_only)
    seed2 = _seed(tmp_path / "seed2", demo_only, both)
    out = tmp_path / "curve.png"
    text = report([seed1, seed2], BENCHES["miniwob-open"], out, "t")
    assert "| base model | 0 | **0.0 %** (0-79) | 0/1 | - |" in text
    assert "| warm start (rl's start) | 16 | **50.0 %** (9-91) | 1/2 | - | - |" in text
    assert "| RL v1 | 20 | **100.0 %** (34-100) | - | 2/2 | - |" in text
    assert "| control v1 | 20 | **50.0 %** (9-91) | - | 1/2 | - |" in text
    # pooled, with demonstrations (click-test), without (click-button)
    assert (
        "| seed1 | RL on own successes | 20 | **100.0 %** (34-100), 2/2 | **100.0 %** (21-100), 1/1 | "
        "**100.0 %** (21-100), 1/1 |"
    ) in text
    assert "| seed1 | control: demonstrations only | 20 | **50.0 %** (9-91), 1/2 | " in text
    assert "seed1: RL 100.0 % at 20 steps against control 50.0 % at 20: +50.0 points, intervals overlap" in text
    assert "seed2: RL 50.0 % at 20 steps against control 100.0 % at 20: -50.0 points, intervals overlap" in text
    # the family table marks the families with demonstrations
    assert "| seed | policy | click-test* | focus-text* | enter-text* | click-test-2 | click-button |" in text
    assert "| seed1 | RL on own successes | 1/1 | 0/0 | 0/0 | 0/0 | 1/1 |" in text
    assert "| seed2 | control | 1/1 | 0/0 | 0/0 | 0/0 | 1/1 |" in text
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_an_arm_that_trained_fewer_steps_is_compared_with_the_control_at_its_steps(tmp_path: Path) -> None:
    # the RL arm's first update found too few rows and trained none: 4 steps after the warm start, not 8
    run = tmp_path / "seed1"
    _log(run / "warm", [{"iteration": 1, "eval_success_rate": 0.0, "training_steps": 10}], {1: []})
    won, lost = ("mw-heldA-click-link-0000", True), ("mw-heldA-click-link-0000", False)
    _log(
        run / "rl",
        [
            {"iteration": 1, "served_version": None, "eval_success_rate": 0.0, "training_steps": 0},
            {"iteration": 2, "served_version": None, "eval_success_rate": 0.0, "training_steps": 4},
            {"iteration": 3, "served_version": 1, "eval_success_rate": 1.0},
        ],
        {1: [lost], 2: [lost], 3: [won]},
    )
    _log(
        run / "control",
        [
            {"iteration": 1, "served_version": None, "eval_success_rate": 0.0, "training_steps": 4},
            {"iteration": 2, "served_version": 1, "eval_success_rate": 0.0, "training_steps": 4},
            {"iteration": 3, "served_version": 2, "eval_success_rate": 1.0},
        ],
        {1: [lost], 2: [lost], 3: [won]},
    )
    text = report([run], BENCHES["miniwob-open"], None, "t")
    assert "seed1: RL 100.0 % at 14 steps against control 0.0 % at 14: +100.0 points, intervals overlap" in text


def test_the_grpo_arm_is_compared_with_the_rl_arm_at_its_steps_and_a_deficit_can_be_apart(tmp_path: Path) -> None:
    """Issue 43's comparison: grpo against rft (the RL arm) from one warm start, with no control run."""
    run = tmp_path / "seed1"
    _log(run / "warm", [{"iteration": 1, "eval_success_rate": 0.0, "training_steps": 8}], {1: []})
    pages = [f"mw-heldA-click-link-{i:04d}" for i in range(20)]
    for arm, ok in (("rl", True), ("grpo", False)):
        _log(
            run / arm,
            [
                {"iteration": 1, "served_version": None, "eval_success_rate": 0.0, "training_steps": 4},
                {"iteration": 2, "served_version": 1, "eval_success_rate": float(ok)},
            ],
            {1: [(p, False) for p in pages], 2: [(p, ok) for p in pages]},
        )
    text = report([run], BENCHES["miniwob-open"], tmp_path / "c.png", "t")
    assert "grpo arm (" in text and "| grpo v1 | 12 | **0.0 %** (0-16) | 0/20 | - |" in text
    assert "| seed1 | grpo: policy gradient on own episodes | 12 | **0.0 %** (0-16), 0/20 |" in text
    # 0/20 against 20/20: the intervals (0-16 and 84-100) do not meet, whichever arm leads
    assert "seed1: grpo 0.0 % at 12 steps against RL 100.0 % at 12: -100.0 points, intervals apart" in text
    assert "against control" not in text


def test_an_arms_trained_iterations_count_the_train_rollouts_not_the_final_evaluation(tmp_path: Path) -> None:
    """bench/agent_curve.sh runs an arm for --iterations minus these: a rerun continues, never repeats."""
    assert trained_iterations(tmp_path / "none") == 0
    trained = {"train_episodes": 144, "eval_success_rate": 0.5, "training_steps": 4}
    skipped = {"train_episodes": 144, "eval_success_rate": 0.5, "training_steps": None, "update": "skipped"}
    final = {"train_episodes": None, "eval_success_rate": 0.6, "training_steps": None}
    rows = [{"iteration": 1, **trained}, {"iteration": 2, **skipped}, {"iteration": 3, **trained}]
    log = _log(tmp_path / "rl", [*rows, {"iteration": 4, **final}], {})
    assert trained_iterations(log) == 3
    # continued to 5 in all: iterations 5 and 6 after the final evaluation at 4, then another
    more = [{"iteration": 5, **trained}, {"iteration": 6, **trained}, {"iteration": 7, **final}]
    assert trained_iterations(_log(tmp_path / "rl2", [*rows, {"iteration": 4, **final}, *more], {})) == 5
