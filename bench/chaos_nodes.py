"""Fault injection on several nodes: a heartbeat or a whole node killed, the restart docs/multinode.md tells a user.

    PYTHONPATH=. $BATON_APP_PY -m bench.chaos_nodes --data-path D --rounds 12 --seed 1 --out chaos-nodes.json
    PYTHONPATH=. $BATON_APP_PY -m bench.chaos_nodes --data-path D --rounds 10 --seed 1 --late 3   # >= 3 late restarts
    PYTHONPATH=. $BATON_APP_PY -m bench.chaos_nodes --data-path D --faults "$KIND" --rounds 1   # one kind of FAULTS
    PYTHONPATH=. $BATON_APP_PY -m bench.chaos_nodes --data-path D --profile gluster-5s --rounds 2   # a served volume

Two "nodes" on this machine, as tests/e2e/test_multinode.py and bench/multinode_overhead.py simulate them: two
`scripts/run.sh --rl-phase both --num-nodes 2 --rank-weights 1,1` (--master, --worker 1) sharing one log path,
each in a session of its own, bound with taskset (and its vLLM with VLLM_CPU_OMP_THREADS_BIND) to its own core,
with its own vLLM port, node address 127.0.0.1 and Baton's default liveness (a beat every 5 s, a rank dead after
30 s of silence: `--heartbeat`, `--dead-after`).
With `--profile gluster|gluster-5s|sshfs` (as root) the log path is on a volume served here (bench/sharedfs.py)
and each node is as in the multi-node e2e tests (bench/nodes.py): run.sh in PID, UTS and mount namespaces of
its own (still bound with taskset), host name node<r>, address 127.0.0.<r+2>, its own client of the volume at
<--log-path>/shared (the nodes' log path: shared/log); the harness reads the log path in the volume's store
(fs-state/brick/log, or fs-state/export/log for sshfs: where it stays after the soak) and keeps run.sh's outputs
in <--log-path>/chaos/. `--log-path` is then a new folder each soak (default `local`: the disk, as above).
A round runs the next iteration with bench/chaos.py's small settings (`SETTINGS`), `--max-iterations 1` (a late
restart's: 3; a worker's death in a continue run's training: 2, `NodeFault.iterations`) and the round's
`--on-rank-failure` (`abort` or `continue`), waits until the fault's phase runs on
the struck node in its first iteration (its recorded group `rollout-train` in `run/rank_<r>/groups.json`; for the
training, its LLaMA-Factory groups `training/iter_<NNNN>/train[.rank_<r>].log.pgid`, or its warm trainer's job of
that training started and not done, in `run/rank_<r>/trainer/`), then a seeded random moment more, and
strikes (`FAULTS`):

- a heartbeat: SIGKILL of the group `heartbeat` of `run/rank_<r>/groups.json` (the node's run.sh lives on, and must
  start it again before the others count the node dead: no node may stop); in a namespace the recorded id is
  the node's own, mapped to this machine's through /proc/<pid>/status NSpgid of the node's processes;
- a whole node, as a machine losing power: SIGSTOP of the node's run.sh session and of every group the node
  recorded (read again until no new one appears), then SIGKILL of all of them at once; in a namespace SIGKILL
  of the node's pid 1 (unshare's child), which kills every process of it, its client included, at once.

Then it acts as docs/multinode.md tells a user: a node that stopped saying "start every node again with --resume"
is waited for and every node is started again with --resume (at most 3 times); in a `continue` run a worker that
died or was evicted is started again with the same flags while the master runs ("a restarted worker joins the
live run"): at once, or in a late-restart kind only once the master has begun its next step (planned without
the worker: its plan `cluster/runs/<run_id>/barriers/iter_0002/plan/rank_0.json`) and a seeded moment into it
(up to LATE_SPREAD_S); the worker must then be a member of a later step (its sealed journal in a later iteration,
bench/chaos_checks.check_rejoined), every iteration of the round done, the restarted worker's exit 0. A node
still running `stop_bound_s` after the master finished the run (exit 0) is a hang (SIGTERM). Every run.sh has
`--run-budget` seconds (a hang past it: SIGTERM, SIGKILL 60 s later). At the end it checks the log path
(bench/chaos_checks.py: every planned episode of every rank once, takeover journals included, in every iteration;
the policy chain; one record per iteration; phase deadlines; nothing left running: in namespaces, what a node's
pid 1 found still running after run.sh exited, its exit 99, and no process here naming the log path or a vLLM
port) and how long the surviving nodes took to stop after the fault (the deadline: `dead_after_s`, two beats and
the clean-up's).

Every signal goes to a run.sh this harness started (its Popen: a session of its own; in a namespace the child of
the node's pid 1 that runs run.sh, and SIGTERM goes there, since unshare and pid 1 ignore it) or to a group the run
recorded, after the leader's start time is checked (bench/chaos_checks.start_time, as coordinator/driver/procs.py
does). Nothing is found by name. docs/reliability.md ("Several nodes") has a soak's table and what it found.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos import REPO, SETTINGS, draw, free_port, log, report
from bench.chaos_checks import check_iterations_done, check_log, check_rejoined, member_iterations, start_time
from bench.nodes import LEFT_RUNNING, NO_MOUNT, host_pgid, host_pid, node_command, signal_run_sh
from bench.nodes import kill_node as kill_namespace
from bench.sharedfs import PROFILES, SharedFs, shared_fs
from coordinator import groupfile
from coordinator.cluster import Cluster, load_run
from coordinator.runstate import load_markers, next_iteration, state_iterations
from rollout_engine.layout import Layout
from training.warm import job_started

#: what a node's clean-up may take once it noticed (Groups.stop: SIGTERM, SIGKILL after 10 s; the update 15 s + 5 s)
CLEANUP_S = 60.0
#: how far into a phase a fault may strike (seconds; on 2 cores a node's 48 episodes take ~15 s, its training ~30 s)
SPREAD_S = {"train_rollout": 6.0, "training": 10.0}
#: a late restart: how far into the master's later step the dead worker is started again (seconds; the master's
#: step alone on 2 cores takes a minute or more, so the worker joins before the master plans the step after it)
LATE_SPREAD_S = 20.0
#: the iterations a round of a late-restart kind runs (--max-iterations): the struck one, the step planned
#: without the dead worker, the step it rejoins
LATE_ITERATIONS = 3
NODES = 2
#: a run.sh's output: <log>/chaos/run_<k>.rank_<r>.log (with --profile: <soak folder>/chaos/)
RUN_OUTPUT = re.compile(r"run_(\d+)\.rank_\d+\.log")
#: a node's first process (bench/nodes.py NODE_INIT) found processes left after run.sh exited (its code)
LEFT_LINE = re.compile(r"^\[node (\S+)\] left running after run.sh exited \((-?\d+)\):$", re.MULTILINE)


@dataclass(frozen=True)
class NodeFault:
    """One kind of fault: which node (`rank`), in which of its phases, what (`action`), in which mode."""

    kind: str
    rank: int  # 0: the master
    phase: str  # train_rollout | training: the struck node's phase when it strikes
    action: str  # heartbeat: SIGKILL of its heartbeat group | node: the whole node at once
    mode: str  # --on-rank-failure of the round: abort | continue
    #: continue: a dead worker is started again at once (False), or only once the master began a later step
    late: bool = False

    @property
    def rejoins(self) -> bool:
        """A worker's death in a continue run: the master goes on, the worker is started again and rejoins."""
        return self.mode == "continue" and self.rank != 0 and self.action == "node"

    @property
    def iterations(self) -> int:
        """--max-iterations of the round's runs: a late restart's LATE_ITERATIONS; a worker's death in a continue
        run's training 2, the struck iteration (its update fails: a training's node died) and the one the worker
        rejoins, whose update must be promoted (a run whose last update failed ends with exit 1, docs/cli.md)."""
        if self.late:
            return LATE_ITERATIONS
        return 2 if self.rejoins and self.phase == "training" else 1


FAULTS = {
    f.kind: f
    for f in [
        NodeFault("worker heartbeat SIGKILL (rollout)", 1, "train_rollout", "heartbeat", "abort"),
        NodeFault("master heartbeat SIGKILL (training)", 0, "training", "heartbeat", "abort"),
        NodeFault("worker node death (rollout)", 1, "train_rollout", "node", "abort"),
        NodeFault("worker node death (training)", 1, "training", "node", "abort"),
        NodeFault("master node death (rollout)", 0, "train_rollout", "node", "abort"),
        NodeFault("master node death (training)", 0, "training", "node", "abort"),
        NodeFault("worker node death (rollout, continue)", 1, "train_rollout", "node", "continue"),
        NodeFault("worker node death (training, continue)", 1, "training", "node", "continue"),
        NodeFault("master node death (rollout, continue)", 0, "train_rollout", "node", "continue"),
        NodeFault("worker heartbeat SIGKILL (training, continue)", 1, "training", "heartbeat", "continue"),
        NodeFault("worker node death (rollout, continue, late restart)", 1, "train_rollout", "node", "continue", True),
        NodeFault("worker node death (training, continue, late restart)", 1, "training", "node", "continue", True),
    ]
}


@dataclass
class NodeRound:
    round: int
    fault: str
    iteration: int
    delay_s: float
    iterations: int = 1  # the round's --max-iterations: iterations iteration .. iteration + iterations - 1
    late_s: float | None = None  # a late restart: seconds into the master's later step it was started again
    restarted_in_step: int | None = None  # ... the master's step it was started in (2: the step after the fault)
    rejoined_in: list[int] = field(default_factory=list)  # a rejoin: the later iterations the worker rolled out
    seen: bool = False  # the struck node was seen running the fault's phase
    injected: bool = False  # False: the phase had ended before the moment came, or was never seen (missed)
    exits: dict[str, int | None] = field(default_factory=dict)  # "rank 0 (run 3)" -> run.sh's exit code
    stopped_s: dict[str, float] = field(default_factory=dict)  # rank -> seconds from the fault to its exit
    rejoins: int = 0  # continue: workers started again while the master ran
    restarts: int = 0  # every node started again with --resume
    recovered: bool = False
    recovery_s: float = 0.0  # from the fault to the iteration done
    hangs: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    leftovers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    said: dict[str, str] = field(default_factory=dict)  # rank -> run.sh's last error or warning after the fault


class Node:
    """One simulated node: rank `rank`'s run.sh on its own core and vLLM port; with `namespaced`, in namespaces
    of its own (bench/nodes.py: `proc` is its unshare)."""

    def __init__(self, rank: int, core: int, port: int, namespaced: bool = False) -> None:
        self.rank, self.core, self.port, self.namespaced = rank, core, port, namespaced
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.runs = 0
        self.resume = False
        self.reaped = True  # its exit has been handled

    @property
    def name(self) -> str:
        return "master" if self.rank == 0 else f"rank {self.rank}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM to run.sh (in a namespace: unshare and the node's pid 1 ignore it; run.sh is pid 1's child)."""
        if not self.namespaced:
            self.proc.terminate()
            return
        with contextlib.suppress(ProcessLookupError, RuntimeError, TimeoutError):
            signal_run_sh(self.proc, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL of run.sh; in a namespace of the node's pid 1: everything in it at once."""
        if not self.namespaced:
            self.proc.kill()
            return
        with contextlib.suppress(ProcessLookupError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            kill_namespace(self.proc)


class ChaosNodes:
    """One soak on one log path: NODES run.sh nodes, faults, the user's restarts, the checks."""

    def __init__(
        self,
        data: Path,
        log_path: Path,
        extra: list[str],
        run_budget_s: float,
        heartbeat_s: float,
        dead_after_s: float,
        fs: SharedFs | None = None,
    ) -> None:
        """Without `fs`, the nodes and this harness share `log_path` on this machine's disk, run.sh's outputs in
        <log_path>/chaos/. With `fs` (a served volume, bench/sharedfs.py), `log_path` is the soak's folder: the
        nodes, each in namespaces of its own through its own client, get the log path fs.path/log; this harness
        reads it in the volume's store (fs.store/log: what the server holds, no client cache of its own
        between), and keeps run.sh's outputs in <log_path>/chaos/."""
        self.data, self.extra, self.run_budget_s = data, extra, run_budget_s
        self.heartbeat_s, self.dead_after_s, self.fs = heartbeat_s, dead_after_s, fs
        #: the log path the nodes are given (run_log) and where this harness reads it (log)
        self.run_log = log_path if fs is None else fs.path / "log"
        self.log = log_path if fs is None else fs.store / "log"
        self.outputs = log_path / "chaos"
        if fs is not None:
            self.run_log.mkdir(exist_ok=True)
        cores = sorted(os.sched_getaffinity(0))
        self.nodes = [Node(r, cores[r % len(cores)], vllm_port(r), fs is not None) for r in range(NODES)]
        self.mode = "abort"
        self.iterations = 1  # --max-iterations of the round's runs
        self.outputs.mkdir(parents=True, exist_ok=True)
        # run.sh starts so far: a soak continued on a log path numbers its outputs after the earlier soak's
        self.starts = max((int(m.group(1)) for m in map(RUN_OUTPUT.fullmatch, self.output_names()) if m), default=0)

    # ---- run.sh ---------------------------------------------------------------------------------------
    def output_names(self) -> list[str]:
        return [path.name for path in self.outputs.glob("run_*.log")]

    def output_path(self, node: Node) -> Path:
        return self.outputs / f"run_{node.runs:03d}.rank_{node.rank}.log"

    def start(self, node: Node, resume: bool) -> None:
        """Node's run.sh for one iteration, in a session of its own (with a volume: in namespaces of its own,
        bench/nodes.py), bound to its core; output to a file."""
        self.starts += 1
        node.runs, node.resume, node.started, node.reaped = self.starts, resume, time.monotonic(), False
        args = ["--data-path", str(self.data), "--log-path", str(self.run_log), "--rl-phase", "both"]
        args += ["--eval-interval", "1000", "--max-iterations", str(self.iterations)]
        args += ["--num-nodes", str(NODES), "--rank-weights", ",".join(["1"] * NODES), "--on-rank-failure", self.mode]
        args += ["--master"] if node.rank == 0 else ["--worker", str(node.rank)]
        args += (["--resume"] if resume else []) + SETTINGS + self.extra
        env = {
            **os.environ,
            "BATON_HEARTBEAT_S": f"{self.heartbeat_s:g}",
            "BATON_DEAD_AFTER_S": f"{self.dead_after_s:g}",
        }
        env |= {"VLLM_CPU_OMP_THREADS_BIND": str(node.core), "BATON_PROGRESS_S": "0"}
        if self.fs is None:
            command = ["bash", str(REPO / "scripts/run.sh"), *args]
            env |= {"BATON_VLLM_PORT": str(node.port), "BATON_NODE_ADDR": "127.0.0.1"}
        else:  # its host name node<r>, its address 127.0.0.<r+2> and its own client of the volume
            command, extra = node_command(node.rank, REPO / "scripts/run.sh", args, self.fs)
            env |= {"BATON_VLLM_PORT": str(node.port), **extra}
        cmd = ["taskset", "-c", str(node.core), *command]
        with open(self.output_path(node), "w") as out:  # the child holds its own copy (never a pipe)
            node.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_all(self, resume: bool) -> None:
        for node in self.nodes:
            self.start(node, resume)

    def output(self, node: Node) -> str:
        path = self.output_path(node)
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        """At the harness's exit: SIGTERM each run.sh it started that still runs (it stops its groups)."""
        for node in self.nodes:
            if node.alive():
                node.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.proc.wait()

    # ---- the nodes' recorded groups ---------------------------------------------------------------------
    def records(self, rank: int) -> list[tuple[str, int, str]]:
        """(name, pgid, leader start time) of every group node `rank` recorded: its run directory's (named as
        there) and its LLaMA-Factory groups (named by their listing: train.log.pgid on the master,
        train.rank_<r>.log.pgid on a worker)."""
        mine = "train.log.pgid" if rank == 0 else f"train.rank_{rank}.log.pgid"
        groups = Layout(self.log).groups(rank)
        out = [(name, r.pgid, r.start or "-") for name, r in sorted(groupfile.read(groups).items())]
        for path in sorted(self.log.glob(f"training/iter_*/{mine}")):
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            for parts in (line.split() for line in lines):
                if parts and parts[0].isdigit():
                    out.append((path.name, int(parts[0]), parts[1] if len(parts) > 1 else "-"))
        return out

    def in_phase(self, rank: int, phase: str, iteration: int) -> bool:
        """Node `rank` runs `phase` of `iteration` now, from the run's own records: its group `rollout-train`; for
        the training, its fresh LLaMA-Factory groups or its warm trainer's job of this iteration's training
        (started and not yet done: training/warm.py's files)."""
        layout = Layout(self.log)
        if phase != "training":
            return "rollout-train" in groupfile.read(layout.groups(rank))
        listing = layout.training_dir(iteration) / ("train.log.pgid" if rank == 0 else f"train.rank_{rank}.log.pgid")
        with contextlib.suppress(OSError):
            if listing.read_text().split():
                return True
        if layout.marker(iteration, "update").exists():
            return False
        argv = job_started(layout.trainer_dir(rank))
        return argv is not None and {"phase=train", f"iteration={iteration}"} <= set(argv)

    @staticmethod
    def ours(pgid: int, start: str) -> bool:
        """The recorded group is still the one recorded: its leader has the recorded start time, or the leader
        is gone (Linux reuses no pid while a group of that id has members)."""
        now = start_time(pgid)
        return now is None or start in ("-", now)

    def wait_phase(self, fault: NodeFault, iteration: int) -> bool:
        """Wait until the struck node runs the fault's phase; False when a node exits first or it is over."""
        done = Layout(self.log).marker(iteration, "update")
        deadline = time.monotonic() + self.run_budget_s
        while time.monotonic() < deadline:
            if self.in_phase(fault.rank, fault.phase, iteration):
                return True
            if done.exists() or not all(node.alive() for node in self.nodes):
                return False
            time.sleep(0.05)
        raise TimeoutError(
            f"waited {self.run_budget_s:.0f} s (--run-budget) for the {fault.phase} of rank {fault.rank} "
            f"in iteration {iteration} to start"
        )

    # ---- the faults ---------------------------------------------------------------------------------
    def kill_heartbeat(self, rank: int) -> bool:
        """SIGKILL of the heartbeat group node `rank` recorded (in a namespace: the group the node knows by
        that id, its leader's start time checked as here)."""
        sent = False
        for name, pgid, start in self.records(rank):
            if name != "heartbeat":
                continue
            if self.fs is None:
                if self.ours(pgid, start):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
                        sent = True
                continue
            with contextlib.suppress(ProcessLookupError, RuntimeError, TimeoutError):
                proc = self.nodes[rank].proc
                leader = host_pid(proc, pgid)
                group = host_pgid(proc, pgid)
                if group is not None and (leader is None or self.ours(leader, start)):
                    os.killpg(group, signal.SIGKILL)
                    sent = True
        return sent

    def kill_node(self, node: Node) -> bool:
        """The node loses power: freeze its run.sh's session and every group it recorded (reading the records
        again until no new one appears: a frozen node records nothing more), then SIGKILL them all. In a
        namespace: SIGKILL of the node's pid 1, which kills every process of it at once."""
        if not node.alive():
            return False
        if node.namespaced:
            try:
                kill_namespace(node.proc)
            except (ProcessLookupError, RuntimeError):
                return False  # it exited just now
            return True
        frozen = {node.proc.pid}  # run.sh's own session: the harness started it so; its pid is not reaped yet
        os.killpg(node.proc.pid, signal.SIGSTOP)
        while True:
            new = {pgid for _, pgid, start in self.records(node.rank) if pgid not in frozen and self.ours(pgid, start)}
            if not new:
                break
            for pgid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGSTOP)
            frozen |= new
        for pgid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        node.proc.wait()
        return True

    def inject(self, fault: NodeFault, iteration: int, delay: float, row: NodeRound) -> float | None:
        """Wait for the fault's phase on its node, `delay` s more, then strike; the moment, or None (missed)."""
        if not self.wait_phase(fault, iteration):
            return None
        row.seen = True
        time.sleep(delay)
        node = self.nodes[fault.rank]
        if not self.in_phase(fault.rank, fault.phase, iteration) or not node.alive():
            return None
        row.injected = self.kill_heartbeat(fault.rank) if fault.action == "heartbeat" else self.kill_node(node)
        return time.monotonic() if row.injected else None

    # ---- the user -----------------------------------------------------------------------------------
    def must_stop(self, fault: NodeFault) -> set[int]:
        """The ranks the docs say stop after a node's death (each within `stop_bound_s`): every other node of
        an abort run; in a continue run the workers when the master is lost (a lost worker is left out)."""
        if fault.action != "node" or (fault.mode == "continue" and fault.rank != 0):
            return set()
        return {node.rank for node in self.nodes if node.rank != fault.rank}

    @staticmethod
    def not_as_documented(fault: NodeFault, row: NodeRound) -> list[str]:
        """What went otherwise than docs/multinode.md says: after a heartbeat's SIGKILL no node stops (its node
        starts it again); in a continue run a lost worker does not end the master's run, and no node needs a
        restart with --resume."""
        out = []
        if fault.action == "heartbeat":
            out += [f"{run} exited {rc} after the heartbeat's SIGKILL" for run, rc in row.exits.items() if rc]
        elif fault.mode == "continue" and fault.rank != 0:
            out += [
                f"{run} exited {rc} after a worker's death" for run, rc in row.exits.items() if rc and "master" in run
            ]
        if (fault.action == "heartbeat" or (fault.mode == "continue" and fault.rank != 0)) and row.restarts:
            out.append(f"every node was started again with --resume {row.restarts} time(s)")
        return out

    def stop_bound_s(self) -> float:
        """How long after a fault a node that must stop may run: a rank is dead after dead_after_s without a
        heartbeat change (seen within a beat), then its clean-up."""
        return self.dead_after_s + 2 * self.heartbeat_s + CLEANUP_S

    def rejoin(self, node: Node, rc: int) -> bool:
        """docs/multinode.md, --on-rank-failure continue: a worker that died or was evicted is started again
        (the same flags) and joins the live run: while the master runs."""
        return self.mode == "continue" and node.rank != 0 and rc != 0 and self.nodes[0].alive()

    def hang(self, node: Node, row: NodeRound, waiting_for: str, budget: bool = True) -> None:
        past = f"--run-budget {self.run_budget_s:.0f} s " if budget else ""
        row.hangs.append(f"{node.name} (run {node.runs}): run.sh ran past {past}{waiting_for}")
        log(f"  hang: {row.hangs[-1]}; SIGTERM")
        node.terminate()
        try:
            node.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log(f"  {node.name} ignored SIGTERM for 60 s; SIGKILL")
            node.kill()
            node.proc.wait()

    def settle(self, row: NodeRound, struck: float | None, iteration: int, late: float | None = None) -> None:
        """Wait until every node has exited, restarting a lost worker of a continue run as the docs say: at once,
        or (`late`: seconds) only once the master has begun a later step of its run, `late` s into it. A node
        still running `stop_bound_s` after the master finished the run (exit 0) is a hang."""
        waiting: list[Node] = []  # dead workers to start again late
        later: tuple[int, float] | None = None  # the master's later step: (its number, seen at)
        finished: float | None = None  # when the master exited 0
        while not all(node.reaped for node in self.nodes) or waiting:
            for node in self.nodes:
                if node.reaped:
                    continue
                rc = node.proc.poll()
                if rc is None:
                    if time.monotonic() - node.started > self.run_budget_s:
                        self.hang(node, row, f"in iteration {iteration}")
                    elif finished is not None and time.monotonic() - finished > self.stop_bound_s():
                        self.hang(node, row, f"{self.stop_bound_s():.0f} s after the master finished the run", False)
                    continue
                node.reaped = True
                if node.namespaced:
                    rc = self.node_exit(node, rc, row)
                row.exits[f"{node.name} (run {node.runs})"] = rc
                if node.rank == 0 and rc == 0:
                    finished = time.monotonic()
                if struck is not None and str(node.rank) not in row.stopped_s:
                    row.stopped_s[str(node.rank)] = round(time.monotonic() - struck, 1)
                    said = last_said(self.output(node))
                    if said:
                        row.said[str(node.rank)] = said
                if self.rejoin(node, rc) and row.rejoins < 3:
                    row.rejoins += 1
                    if late is None:
                        log(f"  {node.name} exited {rc} while the master runs: started again (it rejoins)")
                        self.start(node, node.resume)
                    else:
                        log(
                            f"  {node.name} exited {rc} while the master runs: started again once the master "
                            f"begins a later step, {late:.1f} s into it"
                        )
                        waiting.append(node)
            if waiting:
                if not self.nodes[0].alive():
                    names = ", ".join(n.name for n in waiting)
                    row.problems.append(f"the master exited before it began a later step: {names} not restarted")
                    waiting = []
                else:
                    step = master_step(self.log)
                    if later is None and step > 1:
                        later = (step, time.monotonic())
                    if later is not None and time.monotonic() - later[1] >= late:
                        row.late_s = round(time.monotonic() - later[1], 1)
                        row.restarted_in_step = master_step(self.log)
                        for node in waiting:
                            log(
                                f"  the master began step {later[0]}: {node.name} started again "
                                f"{row.late_s} s into it (step {row.restarted_in_step} now)"
                            )
                            self.start(node, node.resume)
                        waiting = []
            time.sleep(0.2)

    def node_exit(self, node: Node, rc: int, row: NodeRound) -> int:
        """A node in a namespace exited `rc`: what its pid 1 said besides run.sh's code. Processes left running
        after run.sh exited (exit LEFT_RUNNING) are a leftover of the round and run.sh's own code is returned;
        a client that did not mount is a problem."""
        output = self.output(node)
        left = list(LEFT_LINE.finditer(output)) if rc == LEFT_RUNNING else []
        if left:
            lines = [ln.strip() for ln in output[left[-1].end() :].splitlines() if ln.strip()]
            found = [f"{node.name} (run {node.runs}), in its namespace after run.sh exited: {ln}" for ln in lines]
            row.leftovers += found
            row.problems += [f"left running: {item}" for item in found]
            return int(left[-1].group(2))
        if rc == NO_MOUNT and "its shared-filesystem client did not mount" in output:
            row.problems.append(f"{node.name} (run {node.runs}): its shared-filesystem client did not mount")
        return rc

    def next_iteration(self) -> int:
        """The iteration the master runs now (coordinator/runstate.py next_iteration, as the driver reads it)."""
        return next_iteration(self.log)

    def round(
        self, number: int, fault: NodeFault, delay: float, deadlines: dict[str, float], late: float = 0.0
    ) -> NodeRound:
        """The fault's iterations (one; a late restart's LATE_ITERATIONS) with `fault` struck `delay` s into its
        phase of the first, the restarts (a late one `late` s into the master's next step), then the checks."""
        iteration = self.next_iteration()
        last = iteration + fault.iterations - 1
        row = NodeRound(number, fault.kind, iteration, round(delay, 2), fault.iterations)
        self.mode, self.iterations = fault.mode, fault.iterations
        began = time.monotonic()
        self.start_all(resume=self.starts > 0 or bool(state_iterations(self.log)))  # a soak continued
        struck = self.inject(fault, iteration, delay, row)
        self.settle(row, struck, iteration, late if fault.late else None)
        update = load_markers(self.log, iteration).get("update", "")
        if not row.seen and not (fault.phase == "training" and update.startswith("skipped")):
            # a phase this harness cannot find in the run's records is struck in no round, soak after soak
            row.problems.append(f"the {fault.phase} of rank {fault.rank} in iteration {iteration} was never seen")
        done = Layout(self.log).marker(last, "iteration")
        while not done.exists() and row.restarts < 3:
            row.restarts += 1
            self.iterations = last - self.next_iteration() + 1  # the round's iterations left
            self.start_all(resume=True)
            self.settle(row, None, self.next_iteration())
        row.recovered = done.exists() and not check_iterations_done(self.log, iteration, last)
        if done.exists():
            row.problems += check_iterations_done(self.log, iteration, last)
        row.recovery_s = round(time.monotonic() - (struck or began), 1)
        if struck is not None:
            row.problems += self.not_as_documented(fault, row)
        if struck is not None and fault.rejoins and fault.iterations > 1:
            worker = self.nodes[fault.rank]
            row.rejoined_in = [n for n in member_iterations(self.log, worker.rank) if iteration < n <= last]
            row.problems += check_rejoined(self.log, worker.rank, iteration, last)
            restarted = row.late_s is not None if fault.late else row.rejoins > 0
            if restarted and worker.proc is not None and worker.proc.returncode:
                row.problems.append(f"the restarted {worker.name} (run {worker.runs}) exited {worker.proc.returncode}")
            update = load_markers(self.log, last).get("update", "")
            if not fault.late and not update.startswith("promoted"):
                row.problems.append(f"iteration {last}'s update, with the worker back: {update or 'not done'}")
        if struck is not None:
            bound = self.stop_bound_s()
            for rank in sorted(self.must_stop(fault)):
                took = row.stopped_s.get(str(rank))
                if took is not None and took > bound:
                    row.hangs.append(f"rank {rank} stopped {took:.0f} s after the fault, past {bound:.0f} s")
        needles = [f"--port {node.port}" for node in self.nodes] + ([str(self.run_log)] if self.fs else [])
        # in namespaces the recorded groups are the nodes' own ids, and nothing of a node outlives its pid 1:
        # what was left there, NODE_INIT said (node_exit); here, the command lines
        report = check_log(self.log, deadlines=deadlines, needles=needles, recorded=self.fs is None)
        row.lost, row.duplicated = report.lost, report.duplicated
        row.leftovers += report.leftovers
        row.hangs += report.late
        row.problems += report.problems()
        return row


def vllm_port(rank: int) -> int:
    """A free port below the kernel's ephemeral range for node `rank`'s vLLM: the nodes share this host, and the
    master's torchrun port (a free, so ephemeral, port it picks at its start and binds at each training) must
    not land on a port another node's vLLM takes later (it did once: EADDRINUSE, and the worker's torchrun
    talked to that vLLM instead)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in range(low - 1000 + 10 * rank, low):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return free_port()


def master_step(log: Path) -> int:
    """The newest step the master of the run on the log path has planned (its published plan, the arrival
    `cluster/runs/<run_id>/barriers/iter_<step>/plan/rank_0.json`); 0 before any."""
    record = load_run(log)
    if record is None:
        return 0
    cluster = Cluster(log, record.run_id, rank=0)
    step = 0
    while (cluster.barrier_dir(step + 1, "plan") / "rank_0.json").exists():
        step += 1
    return step


def split_kinds(text: str) -> list[str]:
    """--faults: kinds separated by commas outside parentheses (a kind's own, as in "(rollout, continue)", stay)."""
    return [kind.strip() for kind in re.split(r",(?![^()]*\))", text) if kind.strip()]


def at_least_late(plan: list[str], late: list[str], n: int) -> list[str]:
    """`plan` with at least `n` rounds (at most all) of the `late` kinds: rounds of other kinds replaced from the
    last one back, each by the late kind the plan has fewest of (the first such in `late`)."""
    plan = list(plan)
    for index in reversed(range(len(plan))):
        if not late or sum(kind in late for kind in plan) >= n:
            break
        if plan[index] not in late:
            plan[index] = min(late, key=plan.count)
    return plan


def last_said(output: str) -> str:
    """run.sh's last error or warning line (what it told the user on its way out)."""
    lines = [ln for ln in output.splitlines() if ln.startswith("[baton] error:") or ln.startswith("[baton] warning:")]
    return lines[-1][:300] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_nodes", description=__doc__.split("\n")[0])
    parser.add_argument("--data-path", type=Path, required=True)
    parser.add_argument(
        "--log-path",
        type=Path,
        help="default: a new temp directory (kept); with a served --profile, the soak's new folder (the volume's "
        "state and store, fs-state/; its mount, shared/; run.sh's outputs, chaos/)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="local",
        help="local: the log path on this machine's disk, each node a session of its own; gluster, gluster-5s, "
        "sshfs: on a volume served here (bench/sharedfs.py, as root), each node in namespaces of its own "
        "(bench/nodes.py) through its own client",
    )
    parser.add_argument("--rounds", type=int, default=len(FAULTS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default="", help="comma-separated kinds to draw from (default: all)")
    parser.add_argument(
        "--late",
        type=int,
        default=0,
        help="at least this many rounds of a late-restart kind: drawn rounds of other kinds are replaced by them, "
        "from the last round back, the late kinds in turn",
    )
    parser.add_argument(
        "--run-budget",
        type=float,
        default=1800.0,
        help="seconds one run.sh may take (a hang past it): two vLLM starts on 2 cores (300 s each at worst), "
        "the rollouts and a 2-node update (900 s at worst)",
    )
    parser.add_argument("--heartbeat", type=float, default=5.0, help="BATON_HEARTBEAT_S of the nodes (Baton's default)")
    parser.add_argument("--dead-after", type=float, default=30.0, help="BATON_DEAD_AFTER_S (Baton's default)")
    parser.add_argument("--out", type=Path, help="write the rounds and the table as JSON")
    parser.add_argument("overrides", nargs="*", help="more run.sh overrides (key=value)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    kinds = split_kinds(args.faults) or list(FAULTS)
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown kinds {unknown}; the kinds: {', '.join(FAULTS)}")
    plan = at_least_late(draw(kinds, args.rounds, rng), [k for k in kinds if FAULTS[k].late], args.late)
    log_path = (args.log_path or Path(tempfile.mkdtemp(prefix="baton-chaos-nodes-"))).resolve()
    if args.profile != "local" and (log_path / "fs-state").exists():
        parser.error(f"--log-path {log_path}: with --profile, a new folder (the volume is served anew each soak)")
    # so that the `finally`s stop the run.sh it started, and the volume it serves
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack:
        fs = None if args.profile == "local" else stack.enter_context(shared_fs(log_path, args.profile))
        return soak(args, plan, rng, log_path, fs, argv)


def soak(
    args: argparse.Namespace,
    plan: list[str],
    rng: random.Random,
    log_path: Path,
    fs: SharedFs | None,
    argv: list[str] | None,
) -> int:
    """The rounds of `plan` on the log path (with `fs`: on the served volume), the table, the exit code."""
    chaos = ChaosNodes(
        args.data_path.resolve(), log_path, args.overrides, args.run_budget, args.heartbeat, args.dead_after, fs
    )
    # the update's own deadline (launch.timeout_s + grace_s, defaults) and the run budget for the rest
    deadlines = {"update": 3600.0 + 10.0} | dict.fromkeys(
        ["train_rollout", "test_rollout", "train_takeover", "test_takeover", "serve"], args.run_budget
    )
    ports = ", ".join(f"rank {n.rank}: core {n.core}, port {n.port}" for n in chaos.nodes)
    liveness = f"a beat every {args.heartbeat:g} s, dead after {args.dead_after:g} s"
    where = "" if fs is None else f"; {args.profile} served here, the nodes' log path {chaos.run_log}"
    log(f"chaos-nodes: {len(plan)} rounds on {chaos.log} (seed {args.seed}; {ports}; {liveness}{where})")
    log(f"run.sh output: {chaos.outputs}/run_<k>.rank_<r>.log")
    rows = []
    started = time.monotonic()
    try:
        for number, kind in enumerate(plan, start=1):
            fault = FAULTS[kind]
            delay = rng.uniform(0.0, SPREAD_S[fault.phase])
            late = rng.uniform(0.0, LATE_SPREAD_S) if fault.late else 0.0
            row = chaos.round(number, fault, delay, deadlines, late)
            rows.append(row)
            state = "injected" if row.injected else "missed: " + ("the phase ended first" if row.seen else "never seen")
            if fault.late:
                state += f"; restarted {row.late_s} s into the master's step 2 (step {row.restarted_in_step} then)"
            if fault.rejoins and fault.iterations > 1:
                state += f"; a member again in iterations {row.rejoined_in}"
            its = f"iterations {row.iteration}-{row.iteration + row.iterations - 1}" if row.iterations > 1 else ""
            log(
                f"round {number} ({its or f'iteration {row.iteration}'}): {kind} at +{row.delay_s}s: {state}; "
                f"stopped after "
                f"{row.stopped_s} s; exits {row.exits}; {row.rejoins} rejoin(s), {row.restarts} restart(s) of every "
                f"node; {'recovered' if row.recovered else 'NOT recovered'} in {row.recovery_s}s; lost {row.lost}, "
                f"duplicated {row.duplicated}, hangs {len(row.hangs)}, left {len(row.leftovers)}"
            )
            for rank, said in row.said.items():
                log(f"  rank {rank} said: {said}")
            for problem in row.hangs + row.problems:
                log(f"  problem: {problem}")
    finally:
        chaos.stop_all()
    report(rows, "bench.chaos_nodes", argv, chaos.log, started, args.out)
    return 0 if all(r.recovered and not r.problems and not r.hangs for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
