"""bench/chaos_nodes.py's plan and its reading of the master's step (offline, fast): --faults with kinds that
hold commas, --late forcing late-restart rounds, the newest step the master planned, what a node's pid 1 said
(--profile: processes left in its namespace), when a node trains."""

from __future__ import annotations

import random
from pathlib import Path

from bench.chaos import draw
from bench.chaos_nodes import FAULTS, ChaosNodes, NodeRound, at_least_late, master_step, split_kinds
from coordinator.barrier import arrive
from coordinator.cluster import Cluster, Endpoint
from coordinator.membership import start_run
from rollout_engine.files import save_json
from rollout_engine.layout import Layout

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


def test_late_restarts_run_three_iterations_and_a_training_rejoin_two_in_continue_mode() -> None:
    assert len(LATE) == 2
    for kind in LATE:
        fault = FAULTS[kind]
        assert (fault.mode, fault.rank, fault.action, fault.iterations) == ("continue", 1, "node", 3)
    # a worker's death in a continue run's training: the failed update's iteration, then the one it rejoins
    two = {kind for kind in FAULTS if kind not in LATE and FAULTS[kind].iterations == 2}
    assert two == {"worker node death (training, continue)"}
    assert {FAULTS[kind].iterations for kind in FAULTS if kind not in {*LATE, *two}} == {1}


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


def test_what_a_node_s_pid_1_left_running_is_a_leftover_and_run_sh_s_own_code_counts(tmp_path: Path) -> None:
    soak = ChaosNodes(tmp_path / "data", tmp_path / "log", [], 60.0, 5.0, 30.0)
    node = soak.nodes[1]
    node.runs = 4
    said = "[baton] iteration 1 done on rank 1\n[node node1] left running after run.sh exited (0):\n  27 Ss sleep 300\n"
    soak.output_path(node).write_text(said)
    row = NodeRound(1, "worker node death (rollout)", 1, 0.0)
    assert soak.node_exit(node, 99, row) == 0
    assert row.leftovers == ["rank 1 (run 4), in its namespace after run.sh exited: 27 Ss sleep 300"]
    assert row.problems == [f"left running: {row.leftovers[0]}"]
    soak.output_path(node).write_text("[node node1] its shared-filesystem client did not mount /x/shared\n")
    assert soak.node_exit(node, 98, row) == 98 and row.problems[-1].endswith("client did not mount")
    clean = NodeRound(2, "worker node death (rollout)", 1, 0.0)
    assert soak.node_exit(node, 3, clean) == 3 and not clean.leftovers and not clean.problems


def test_a_node_trains_while_its_warm_trainer_runs_this_iteration_s_training_job(tmp_path: Path) -> None:
    """The training phase a fault waits for, under the warm trainer (no `train.log.pgid` there): the node's job of
    this iteration's training handed and started, and not done; under fresh processes its listed groups."""
    soak = ChaosNodes(tmp_path / "data", tmp_path / "log", [], 60.0, 5.0, 30.0)
    layout = Layout(soak.log)
    trainer = layout.trainer_dir(1)
    trainer.mkdir(parents=True)
    assert not soak.in_phase(1, "training", 2)
    save_json(trainer / "done.0.json", {"seq": 3})  # the previous iteration's promotion, done
    save_json(trainer / "job.json", {"seq": 4, "argv": ["phase=train", "iteration=2"], "log": "x"})
    assert not soak.in_phase(1, "training", 2)  # handed, not started
    save_json(trainer / "started.json", {"seq": 4, "timeout_s": 3600})
    assert soak.in_phase(1, "training", 2) and not soak.in_phase(0, "training", 2)
    assert not soak.in_phase(1, "training", 3)  # another iteration's
    save_json(trainer / "done.0.json", {"seq": 4})
    assert not soak.in_phase(1, "training", 2)
    save_json(trainer / "job.json", {"seq": 5, "argv": ["phase=promote"], "log": "x"})
    save_json(trainer / "started.json", {"seq": 5, "timeout_s": 3600})
    assert not soak.in_phase(1, "training", 2)  # the promotion is not the training
    layout.training_dir(2).mkdir(parents=True)
    (layout.training_dir(2) / "train.log.pgid").write_text("4242 12345\n")  # a fresh training's groups
    assert soak.in_phase(0, "training", 2)
