"""bench/chaos_nodes.py's plan and its reading of the master's step (offline, fast): --faults with kinds that
hold commas, --late forcing late-restart rounds, the newest step the master planned."""

from __future__ import annotations

import random
from pathlib import Path

from bench.chaos import draw
from bench.chaos_nodes import FAULTS, ChaosNodes, at_least_late, master_step, split_kinds
from coordinator.barrier import arrive
from coordinator.cluster import Cluster, Endpoint
from coordinator.membership import start_run

LATE = [kind for kind, fault in FAULTS.items() if fault.late]


def test_faults_split_on_the_commas_outside_a_kind_s_parentheses() -> None:
    text = (
        "worker node death (rollout, continue, late restart),master node death (rollout), worker node death (training)"
    )
    assert split_kinds(text) == [
        "worker node death (rollout, continue, late restart)",
        "master node death (rollout)",
        "worker node death (training)",
    ]
    assert split_kinds("") == [] and all(split_kinds(kind) == [kind] for kind in FAULTS)


def test_late_restart_kinds_run_three_iterations_in_continue_mode() -> None:
    assert len(LATE) == 2
    for kind in LATE:
        fault = FAULTS[kind]
        assert (fault.mode, fault.rank, fault.action, fault.iterations) == ("continue", 1, "node", 3)
    assert {FAULTS[kind].iterations for kind in FAULTS if kind not in LATE} == {1}


def test_at_least_late_replaces_the_last_other_rounds_and_keeps_the_late_kinds_balanced() -> None:
    # "c" becomes the late kind the plan lacks, then "b" the first of the two (one each by then)
    assert at_least_late(["a", "b", LATE[0], "c"], LATE, 3) == ["a", LATE[0], LATE[0], LATE[1]]
    assert at_least_late(["a", LATE[0]], LATE, 1) == ["a", LATE[0]]  # enough already
    assert at_least_late(["a", "b"], LATE, 5) == [LATE[1], LATE[0]]  # at most every round
    assert at_least_late(["a", "b"], [], 2) == ["a", "b"]
    plan = at_least_late(draw(list(FAULTS), 10, random.Random(1)), LATE, 3)
    assert len(plan) == 10 and sum(kind in LATE for kind in plan) == 3


def test_master_step_is_the_newest_plan_the_master_published(tmp_path: Path) -> None:
    assert master_step(tmp_path) == 0
    quick = {"heartbeat_interval_s": 0.05, "dead_after_s": 0.5, "poll_s": 0.02}
    record = start_run(tmp_path, 2, [1, 1], me=Endpoint("node-0", "10.0.0.1", 4242), **quick)
    assert master_step(tmp_path) == 0
    cluster = Cluster(tmp_path, record.run_id, rank=0)
    for step in (1, 2):
        arrive(cluster, step, "plan", pid=1, data={"iteration": 4 + step})
        assert master_step(tmp_path) == step
    arrive(Cluster(tmp_path, record.run_id, rank=1), 3, "plan", pid=2, data={})  # a worker's arrival: no plan
    assert master_step(tmp_path) == 2


def test_a_soak_continued_on_a_log_path_numbers_its_run_outputs_after_the_earlier_ones(tmp_path: Path) -> None:
    assert ChaosNodes(tmp_path / "data", tmp_path / "fresh", [], 60.0, 5.0, 30.0).starts == 0
    chaos = tmp_path / "log" / "chaos"
    chaos.mkdir(parents=True)
    for name in ("run_007.rank_1.log", "run_012.rank_0.log", "notes.txt"):
        (chaos / name).write_text("")
    soak = ChaosNodes(tmp_path / "data", tmp_path / "log", [], 60.0, 5.0, 30.0)
    assert soak.starts == 12
    soak.starts += 1
    soak.nodes[0].runs = soak.starts
    assert soak.output_path(soak.nodes[0]).name == "run_013.rank_0.log"
