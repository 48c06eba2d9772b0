"""coordinator/driver/nodes.py: one node of a multi-node run, on a real log path with real heartbeat processes.

What it covers: a start and a join, a plan published and received, a
barrier with data, a heartbeat killed during a wait started again (the 4th exit stops the node), one
that ended the node on purpose left alone, leave's exit codes, a stop request that ends a barrier wait
(143), an eviction, a training partner's failed part, the fence. Master and worker run in this process
(one pid: each heartbeat's --node-pid is pytest's), so the heartbeats' SIGTERM / SIGUSR1 land in the
`signals` fixture's handlers, which end a wait as run.py does (Ended 143).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.barrier import arrive
from coordinator.cluster import Cluster, Eviction, StopRequest
from coordinator.driver import say, startcheck
from coordinator.driver.nodes import SPREAD_FROM_NODES, Members, Node, failed_partner, spread_start, start_delay
from coordinator.driver.procs import Groups
from coordinator.driver.supervise import EXPIRED, Supervisor
from coordinator.fscheck import load_findings
from coordinator.membership import pid_running, start_run
from rollout_engine.layout import GROUPS_NAME
from tests.unit.coordinator.fakes import file_operations, old_run

ROOT = str(Path(__file__).resolve().parents[2])
BEAT_STARTED = "starting it again"


try:
    from coordinator.driver.cli import Args  # type: ignore[attr-defined]
except ImportError:  # cli.py is not there yet

    @dataclass
    class Args:  # type: ignore[no-redef]
        """cli.Args as far as Node reads it."""

        log: str = ""
        phase: str = ""
        num_nodes: int = 1
        rank_weights: str = ""
        rank: int = 0
        node_addr: str = ""
        on_failure: str = "abort"

        @property
        def weights(self) -> list[int]:
            return [int(w) for w in self.rank_weights.split(",")] if self.rank_weights else [1]


#: the command line of a node of the tests' runs (2 nodes, weights 1,1, --rl-phase both, on the loopback)
NODE_ARGS: dict[str, object] = {"num_nodes": 2, "rank_weights": "1,1", "phase": "both", "node_addr": "127.0.0.1"}


#: every wait of a test ends within this (a wait that should end but does not fails the test instead of hanging)
TEST_BOUND_S = 25


class Signals:
    """The heartbeats' signals to this process, caught; a watch ends a wait on SIGTERM as run.py does, and
    fails a test whose waits run past TEST_BOUND_S."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.deadline = time.monotonic() + TEST_BOUND_S

    def handler(self, signum: int, _frame: object) -> None:
        self.got.append(signum)

    def watch(self) -> None:
        assert time.monotonic() < self.deadline, f"a wait still waiting after {TEST_BOUND_S} s"
        if signal.SIGTERM in self.got:
            self.got.remove(signal.SIGTERM)
            raise say.Ended(143)


@pytest.fixture
def signals() -> Iterator[Signals]:
    caught = Signals()
    before = {sig: signal.signal(sig, caught.handler) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield caught
    for sig, handler in before.items():
        signal.signal(sig, handler)


class Nodes:
    """Nodes of one log path; their heartbeats are stopped at the end of the test (before the handlers go)."""

    def __init__(self, log: Path, signals: Signals) -> None:
        self.log, self.signals, self.made = log, signals, []

    def make(self, rank: int, **args: object) -> Node:
        run_dir = self.log / "run" / f"rank_{rank}"
        supervisor = Supervisor(poll_s=0.1)
        supervisor.add(self.signals.watch)
        node = Node(
            Args(log=str(self.log), rank=rank, **{**NODE_ARGS, **args}),
            run_dir,
            Groups(run_dir),
            supervisor,
            ROOT,
            sys.executable,
            8999,
        )
        self.made.append(node)
        return node

    def pair(self, **args: object) -> tuple[Node, Node]:
        master, worker = self.make(0, **args), self.make(1, **args)
        master.start(7)
        worker.start(0)
        return master, worker

    def recorded(self, **args: object) -> Node:
        """A master whose run is recorded (start_run in this process), without a heartbeat."""
        master = self.make(0, **args)
        master.run_id = start_run(self.log, 2, [1, 1], heartbeat_interval_s=0.5, dead_after_s=10).run_id
        return master

    def stop_all(self) -> None:
        for node in self.made:
            node.stop_heartbeat()


@pytest.fixture
def nodes(tmp_path: Path, signals: Signals, monkeypatch: pytest.MonkeyPatch) -> Iterator[Nodes]:
    # no shared-filesystem check at the start (master and worker start one after the other in one thread here)
    settings = {
        "BATON_HEARTBEAT_S": "0.5",
        "BATON_DEAD_AFTER_S": "10",
        "BATON_JOIN_WAIT_S": "30",
        "BATON_FS_CHECK_S": "0",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for name in ("BATON_RUN_ID", "BATON_RUN_FENCE", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    made = Nodes(tmp_path / "log", signals)
    yield made
    made.stop_all()


def beat_pid(node: Node) -> int:
    return Groups(node.run_dir).records()[node.beat_name].pgid


def until(done: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, f"still waiting for {what} after {timeout_s} s"
        time.sleep(0.05)


def test_a_master_and_a_worker_start_trade_a_plan_and_meet_at_a_barrier_with_data(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master, worker = nodes.pair()
    assert worker.run_id == master.run_id != ""
    assert worker.master_addr == master.master_addr == "127.0.0.1"
    assert worker.torchrun_port == master.torchrun_port > 0
    assert os.environ["BATON_RUN_ID"] == master.run_id
    assert os.environ["BATON_RUN_FENCE"] == str(nodes.log / "cluster" / "run.json")
    assert all(pid_running(beat_pid(node)) for node in (master, worker))
    err = capsys.readouterr().err
    assert f"[baton] rank 1: waiting for the master (rank 0) on {nodes.log} (at most 30s)\n" in err
    status = f"status: python -m coordinator status --log-path {nodes.log}"
    assert f"[baton] rank 1 of 2: run {master.run_id}, master 127.0.0.1 (torchrun port {master.torchrun_port});" in err
    assert err.rstrip().endswith(status)

    members = master.members(1)
    assert members == Members([0, 1], [1, 1], {0: master.me, 1: worker.me})
    master.publish(1, "plan", {"iteration": 7, "train": 1, **members.data()})
    plan = worker.receive(1, "plan")
    assert plan == {"iteration": 7, "train": 1, **members.data()}
    assert Members.from_data(plan) == members

    got: dict[str, object] = {}
    thread = threading.Thread(target=lambda: got.update(worker=worker.sync(7, "update", {"train_exit": 0})))
    thread.start()
    synced = master.sync(7, "update", {"exit": 0, "version": "v0001"})
    thread.join(timeout=30)
    assert synced.data == {0: {"exit": 0, "version": "v0001"}, 1: {"train_exit": 0}}
    assert got["worker"].merged() == {"exit": 0, "version": "v0001", "train_exit": 0}  # type: ignore[attr-defined]
    assert synced.gone == []


def test_a_heartbeat_killed_during_a_wait_is_started_again_and_its_4th_exit_stops_the_node(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master = nodes.make(0)  # alone: a worker that never joined is the barriers' to judge, not the heartbeat's
    master.start(1)
    first = beat_pid(master)
    # its few lines (an eviction, a failure) go to the node's own output: no log of its own on the shared path
    assert not (master.run_dir / "logs").exists() or not list((master.run_dir / "logs").iterdir())
    assert Path(f"/proc/{first}/fd/2").resolve() == Path("/proc/self/fd/2").resolve()
    phase = subprocess.Popen(["sh", "-c", "sleep 1.5; exit 7"])
    threading.Timer(0.3, os.kill, (first, signal.SIGKILL)).start()
    assert master.supervisor.wait(phase) == 7  # the wait gets the phase's exit
    assert beat_pid(master) != first and pid_running(beat_pid(master))
    line = "the heartbeat of rank 0 exited (killed by SIGKILL) while this node runs; starting it again"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"[baton] warning: {line} (1 of 3) before the other ranks count this node dead"
    )
    for _ in range(2):
        killed = beat_pid(master)
        os.kill(killed, signal.SIGKILL)
        until(lambda killed=killed: master.supervisor.tick() or beat_pid(master) != killed, "a restart")
    os.kill(beat_pid(master), signal.SIGKILL)
    with pytest.raises(say.Die) as caught:
        until(lambda: master.supervisor.tick() or False, "the 4th exit's end")
    assert caught.value.code == 1
    assert caught.value.message == (
        "the heartbeat of rank 0 exited (killed by SIGKILL) a 4th time (its output, if any, is above);"
        " without it the other ranks count this node dead: stopping it. Start it again with --resume"
        " (docs/multinode.md)"
    )
    assert capsys.readouterr().err.count(BEAT_STARTED) == 2


def test_a_heartbeat_killed_during_a_phase_with_deadlines_is_started_again_while_the_phase_runs(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master = nodes.make(0)
    master.start(1)
    first = beat_pid(master)
    phase = subprocess.Popen(["sleep", "30"])
    threading.Timer(0.3, os.kill, (first, signal.SIGKILL)).start()
    try:  # a rollout's deadlines end the wait while the phase still runs: the restart happened during it
        assert master.supervisor.wait(phase, total_s=4, stall_s=3, progress=lambda: "same") == EXPIRED
    finally:
        phase.kill()
        phase.wait()
    assert beat_pid(master) != first and pid_running(beat_pid(master))
    assert (
        "[baton] warning: the heartbeat of rank 0 exited (killed by SIGKILL) while this node runs; starting it again"
        " (1 of 3) before the other ranks count this node dead\n"
    ) in capsys.readouterr().err


def test_a_heartbeat_that_ended_the_node_on_purpose_is_not_started_again(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master = nodes.make(0)
    master.start(1)
    first = beat_pid(master)
    master.ended_file.write_text("3\trank 1: dead: no heartbeat change seen for 10 s\n")
    os.kill(first, signal.SIGTERM)
    until(lambda: not pid_running(first) or master.supervisor.tick() or False, "the heartbeat's exit")
    master.supervisor.sleep(0.3)
    assert beat_pid(master) == first and not pid_running(first)
    assert BEAT_STARTED not in capsys.readouterr().err
    assert master.leave(143, iteration=2, phase="update", last_error="") == 1
    assert capsys.readouterr().err == (
        "[baton] warning: stopping this node: rank 1: dead: no heartbeat change seen for 10 s;"
        " start every node again with --resume once it is fixed\n"
    )
    # the workers watch only the master: its failure flag, naming the rank its heartbeat found dead, tells them
    failure = Cluster(nodes.log, master.run_id).failures()[0]
    assert (failure.iteration, failure.phase) == (2, "update")
    assert failure.reason == "rank 1: dead: no heartbeat change seen for 10 s"


def test_a_stop_request_ends_a_barrier_wait_with_143_and_the_node_leaves_as_stopped(nodes: Nodes) -> None:
    master = nodes.make(0)
    master.start(1)
    cluster = Cluster(nodes.log, master.run_id)
    threading.Timer(0.5, cluster.request_stop, (StopRequest("operator request", None, "elsewhere", 1),)).start()
    began = time.monotonic()
    with pytest.raises(say.Ended) as caught:
        master.sync(1, "plan_done")  # rank 1 never arrives; it would be dead after 10 s
    assert type(caught.value) is say.Ended and caught.value.code == 143
    assert time.monotonic() - began < 5
    assert master.leave(143, iteration=1, phase="plan_done", last_error="") == 143
    request = cluster.stop_request()
    assert request is not None and request.reason == "operator request"  # the first request's reason stays
    assert not cluster.failures()


def test_a_signal_during_the_join_ends_the_wait_at_once(nodes: Nodes) -> None:
    worker = nodes.make(1)  # no master: the join would wait BATON_JOIN_WAIT_S (30 s)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    began = time.monotonic()
    with pytest.raises(say.Ended) as caught:
        worker.start(0)
    assert caught.value.code == 143 and time.monotonic() - began < 5
    assert worker.run_id == "" and not (worker.run_dir / GROUPS_NAME).exists()
    assert worker.leave(143, iteration=0, phase="", last_error="") == 143


def test_a_continue_run_waits_for_its_planned_workers_and_goes_on_without_an_evicted_one(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master, worker = nodes.pair(on_failure="continue")
    assert worker.continue_mode and master.continue_mode
    master.plan_members(Members([0], [1, 0], {}))  # a step planned without the worker does not wait for it
    assert master.sync(1, "train_rollout", {"n": 1}).data == {0: {"n": 1}}
    members = master.members(2)
    assert members.ranks == [0, 1] and members.incarnations[1] == worker.me
    master.plan_members(members)
    worker.plan_members(Members.from_data(members.data()))
    assert master.planned == worker.planned == {1: worker.me}
    host, pid, started = worker.me
    verdict = Eviction(1, "no heartbeat for 30 s", 0, host, pid, node_host=host, node_pid=pid, node_started=started)
    Cluster(nodes.log, master.run_id).evict(verdict)
    synced = master.sync(2, "train_rollout")
    assert synced.gone == [1] and synced.merged() == {"gone": "1"}
    assert "[baton] rank 0: train_rollout of iteration 2: going on without ranks [1]" in capsys.readouterr().err
    with pytest.raises(say.Die) as caught:
        worker.sync(2, "train_rollout")
    assert caught.value.code == 1
    assert caught.value.message == (
        "the train_rollout barrier of iteration 2: this rank was evicted by the master (declared dead);"
        " restart it with --resume to join again"
    )
    until(lambda: worker.ended() is not None, "the worker's heartbeat to end it")
    assert worker.ended() == (5, "rank 1 was evicted: no heartbeat for 30 s")
    assert worker.leave(1, iteration=2, phase="train_rollout", last_error="") == 1


@pytest.mark.parametrize(
    ("rank", "rc", "ended", "slurm", "code", "written", "line"),
    [
        (0, 0, "", False, 0, "finished", ""),
        (1, 0, "", False, 0, "", ""),  # a worker's end says nothing of the run's
        (0, 1, "", False, 1, "failed 1: update failed", ""),
        (1, 1, "", False, 1, "failed 1: update failed", ""),
        (1, 143, "", False, 143, "failed 143: stopped by SIGTERM", ""),
        (0, 143, "", False, 143, "stop: SIGTERM on the master", "SIGTERM on the master: every node"),
        (0, 130, "", False, 130, "stop: SIGINT on the master", "SIGINT on the master: every node"),
        (1, 143, "", True, 143, "stop: SIGTERM on rank 1 (Slurm job 77: scancel, the time limit or a requeue)", ""),
        (1, 143, "6\tthe run finished: the master ran its last step", False, 0, "", "the run finished: the master"),
        (1, 143, "4\trun stopped: a person on h asked: x", False, 143, "", "[baton] stopped: run stopped: a person"),
        (1, 1, "5\trank 1 was evicted: silent", False, 1, "", "warning: this rank was evicted: rank 1 was evicted"),
    ],
)
def test_leave_gives_run_sh_s_exit_code_and_tells_the_others(
    nodes: Nodes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rank: int,
    rc: int,
    ended: str,
    slurm: bool,
    code: int,
    written: str,
    line: str,
) -> None:
    run_id = nodes.recorded().run_id
    node = nodes.make(rank)
    node.run_id = run_id
    if ended:
        node.ended_file.parent.mkdir(parents=True, exist_ok=True)
        node.ended_file.write_text(ended + "\n")
    if slurm:
        monkeypatch.setenv("SLURM_STEP_ID", "0")
        monkeypatch.setenv("SLURM_PROCID", "1")
        monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert node.leave(rc, iteration=4, phase="update", last_error="update failed") == code
    cluster = Cluster(nodes.log, run_id)
    failures, stop, finished = cluster.failures(), cluster.stop_request(), cluster.finished()
    seen = [f"failed {f.exit_code}: {f.reason}" for f in failures.values()]
    seen += [f"stop: {stop.reason}"] if stop else []
    seen += ["finished"] if finished else []
    assert seen == ([written] if written else [])
    if failures:
        assert (failures[rank].iteration, failures[rank].phase, failures[rank].incarnation) == (4, "update", node.me)
    assert line in capsys.readouterr().err


def test_a_node_stopped_by_the_protocol_flags_nothing_on_its_way_out(nodes: Nodes) -> None:
    master = nodes.recorded()
    ended = master.outcome(4, "the plan barrier of iteration 2")
    assert master.leave(ended.code, iteration=2, phase="plan", last_error="") == 143
    cluster = Cluster(nodes.log, master.run_id)
    assert cluster.stop_request() is None and not cluster.failures()


def test_protocol_outcomes_end_the_node_with_nodes_exit_s_codes_and_words(nodes: Nodes) -> None:
    node = nodes.make(1)
    what = "the plan barrier of step 2"
    outcomes = {code: node.outcome(code, what) for code in (2, 3, 4, 5, 6, 1)}
    assert {code: (type(e).__name__, e.code) for code, e in outcomes.items()} == {
        2: ("Die", 2),
        3: ("Die", 1),
        4: ("Ended", 143),
        5: ("Die", 1),
        6: ("Ended", 0),
        1: ("Die", 1),
    }
    assert say.error_lines(outcomes[6]) == [
        f"[baton] {what}: the run finished (the master ran its last step and exited); this node stops"
    ]
    assert outcomes[3].message.startswith(f"{what}: another rank failed or died (above); stopping this node.")
    assert outcomes[2].message == f"{what}: bad input (above)"
    assert outcomes[1].message == f"{what} failed (exit 1)"


def test_a_master_whose_values_differ_from_the_pinned_ones_exits_2_naming_both(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes.recorded()  # pins --num-nodes 2 --rank-weights 1,1
    master = nodes.make(0, rank_weights="2,1")
    with pytest.raises(say.Die) as caught:
        master.start(1)
    assert (caught.value.code, caught.value.message) == (2, "could not start the multi-node run: bad input (above)")
    assert "[baton] error: --num-nodes 2 --rank-weights 2,1 differ from this experiment's" in capsys.readouterr().err
    assert not (master.run_dir / GROUPS_NAME).exists()


def test_the_fence_stops_a_master_of_a_superseded_run(nodes: Nodes, capsys: pytest.CaptureFixture[str]) -> None:
    master = nodes.recorded()
    master.fence("marking train_rollout of iteration 2")  # still the log path's run
    newer = old_run(nodes.log)
    with pytest.raises(say.Ended) as caught:
        master.fence("marking train_rollout of iteration 2")
    assert type(caught.value) is say.Ended and caught.value.code == 143
    assert caught.value.message == "the run was asked to stop (marking train_rollout of iteration 2); this node stops"
    assert f"superseded by run {newer.run_id} (master gone-host)" in capsys.readouterr().err
    nodes.make(0, num_nodes=1, rank_weights="1").fence("marking train_rollout of iteration 2")  # one node: no run


def test_a_training_partner_s_failed_part_stops_this_node_s_part_once(
    nodes: Nodes, capsys: pytest.CaptureFixture[str]
) -> None:
    master = nodes.recorded()
    mine, theirs = Cluster(nodes.log, master.run_id, rank=0), Cluster(nodes.log, master.run_id, rank=1)
    arrive(mine, 3, "update", data={"train_exit": 1})  # this node's own part: not a partner's
    part = subprocess.Popen(["sleep", "30"])
    stops: list[tuple[int, int]] = []

    def stop_part(rank: int, code: int) -> None:
        stops.append((rank, code))
        part.terminate()

    master.watch_partners(3, stop_part)
    threading.Timer(0.3, arrive, (theirs, 3, "update"), {"data": {"train_exit": 1}}).start()
    began = time.monotonic()
    assert master.supervisor.wait(part) != 0
    assert time.monotonic() - began < 10
    master.supervisor.sleep(0.3)
    assert stops == [(1, 1)]
    assert (
        "[baton] warning: the update of iteration 3: rank 1's part of the training failed (exit 1); it cannot"
        " finish without it: stopping this node's part instead of waiting for it"
    ) in capsys.readouterr().err
    master.unwatch_partners()


def test_a_worker_in_a_training_reads_the_masters_arrival_alone_the_master_each_arrival_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = old_run(tmp_path, num_nodes=3, rank_weights=[1, 1, 1])
    cluster = {rank: Cluster(tmp_path, record.run_id, rank=rank) for rank in range(3)}
    arrive(cluster[2], 3, "update", data={"train_exit": 1})
    mine: dict = {}
    with file_operations(monkeypatch) as calls:
        assert failed_partner(cluster[1], 3, 1, mine) is None  # rank 2's failure is the master's to see
    assert calls == ["read_bytes"]  # the master's arrival by name: one look, whatever the number of nodes
    theirs: dict = {}
    assert failed_partner(cluster[0], 3, 0, theirs) == (2, 1)
    with file_operations(monkeypatch) as calls:
        assert failed_partner(cluster[0], 3, 0, theirs) == (2, 1)
    assert calls == ["scandir"]  # the listing; rank 2's arrival was read at the look before
    arrive(cluster[0], 3, "update", data={"train_exit": 143})  # the master's part, stopped for rank 2's
    assert failed_partner(cluster[1], 3, 1, mine) == (0, 143)


def test_a_partner_s_part_that_succeeded_and_this_node_s_own_failed_part_are_no_partner_failure(
    tmp_path: Path,
) -> None:
    record = old_run(tmp_path)
    master, worker = Cluster(tmp_path, record.run_id, rank=0), Cluster(tmp_path, record.run_id, rank=1)
    arrive(worker, 3, "update", data={"train_exit": 0})
    arrive(master, 3, "update", data={"train_exit": 1})  # the master's own part: not a partner's
    assert failed_partner(master, 3, 0, {}) is None
    arrive(master, 4, "update", data={"train_exit": 0})
    arrive(worker, 4, "update", data={"train_exit": 1})
    assert failed_partner(worker, 4, 1, {}) is None
    arrive(master, 5, "update", data={"exit": 1, "train_exit": 1})
    assert failed_partner(worker, 5, 1, {}) == (0, 1)


def test_the_first_step_of_a_continue_run_waits_for_every_rank_to_join(nodes: Nodes) -> None:
    master, worker = nodes.make(0, on_failure="continue"), nodes.make(1, on_failure="continue")
    master.start(1)
    joined = threading.Timer(1.0, worker.start, args=(0,))
    joined.start()
    try:
        members = master.members(1)
    finally:
        joined.join()
    assert members.ranks == [0, 1]
    assert members.incarnations[1] == worker.me


def test_a_multi_node_start_checks_the_shared_filesystem_beside_the_start(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The start does not wait for the check: the master waits (in a thread) for every rank to register, at most
    REGISTER_WAIT_S, pings those that did, and logs its findings at a supervisor tick once done; a rank that
    starts later takes no part."""
    monkeypatch.setenv("BATON_FS_CHECK_S", "5")
    monkeypatch.setattr(startcheck, "REGISTER_WAIT_S", 2.0)
    three = {"num_nodes": 3, "rank_weights": "1,1,1"}
    master, worker, late = (nodes.make(rank, **three) for rank in range(3))
    master.start(0)
    worker.start(0)
    until(lambda: master.supervisor.tick() or "shared filesystem (" in capsys.readouterr().err, "the findings", 15)
    late.start(0)  # after the master stopped waiting for answers (`closed`): its side ends at once
    until(lambda: late._fscheck is not None and late._fscheck.done, "the late rank's side to end", 10)
    findings = load_findings(Cluster(nodes.log, master.run_id).paths.fscheck / "findings.json")
    pairs = {pair.rank: pair for pair in findings.pairs}
    assert pairs[1].round_trip_s is not None and pairs[1].new_by_name_s is not None
    assert pairs[1].locks_shared is True  # one machine: flock is shared between its open files
    assert pairs[2].round_trip_s is None


def test_the_start_check_s_verdict_ends_the_master_with_exit_2(nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_FS_CHECK_S", "5")
    master, worker = nodes.make(0), nodes.make(1)
    master.start(0)
    worker.start(0)
    check = master._fscheck
    assert check is not None
    until(lambda: check.done, "the master's side", 15)
    check.problems = ["BATON_DEAD_AFTER_S=10 is too short here: ..."]  # as verdict() says (tests/unit/coordinator)
    with pytest.raises(say.Die) as caught:
        master.supervisor.tick()
    assert caught.value.code == 2 and str(caught.value.message).startswith("BATON_DEAD_AFTER_S=10 is too short")


# --- the start, spread over the nodes -------------------------------------------------------------------------


def test_from_64_nodes_the_starts_spread_over_a_minute_so_that_at_most_n_over_60_nodes_start_in_any_second() -> None:
    # each node makes about 12 names at its start (docs/multinode.md, Scale): N/60 starts a second is N/5 names
    assert SPREAD_FROM_NODES == 64
    for nodes in (64, 128, 1000):
        delays = [start_delay(rank, nodes, {}) for rank in range(nodes)]
        assert delays[0] == 0 and max(delays) < 60 and delays == sorted(delays)
        busiest = max(sum(1 for d in delays if second <= d < second + 1) for second in range(60))
        assert busiest <= -(-nodes // 60), (nodes, busiest)
    assert [start_delay(rank, 8, {}) for rank in range(8)] == [0.0] * 8  # below 64 nodes: at once
    assert start_delay(0, 1, {"BATON_START_SPREAD_S": "30"}) == 0.0


def test_baton_start_spread_s_sets_the_spread_at_any_number_of_nodes_and_0_turns_it_off() -> None:
    assert [start_delay(rank, 4, {"BATON_START_SPREAD_S": "20"}) for rank in range(4)] == [0.0, 5.0, 10.0, 15.0]
    assert start_delay(999, 1000, {"BATON_START_SPREAD_S": "0"}) == 0.0


def test_a_spread_start_says_how_long_it_waits_and_waits_that_long(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slept: list[float] = []
    monkeypatch.setenv("BATON_START_SPREAD_S", "20")
    spread_start(3, 4, sleep=slept.append)
    assert slept == [15.0]
    assert capsys.readouterr().err == (
        "[baton] rank 3 of 4: starting in 15.0s, the nodes' starts spread over 20s to spare the shared "
        "filesystem's metadata server (BATON_START_SPREAD_S; docs/multinode.md)\n"
    )
    spread_start(0, 4, sleep=slept.append)  # the master starts at once
    assert slept == [15.0] and capsys.readouterr().err == ""
