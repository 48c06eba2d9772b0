"""One node of a multi-node run: start or join, the heartbeat, plans, barriers, the way out.

The protocol (coordinator.membership, .barrier, .cluster) runs in this process, its waits ticking the driver's
watches (`Supervisor.tick` every poll), so a dead child, a killed heartbeat or a signal is noticed during a
join or a barrier too. The heartbeat alone is a process group of its own (`python -m coordinator heartbeat
--stop-node`): it beats while the driver is busy or stuck, and it ends the node (SIGTERM, its reason in
`run/rank_<r>/ended`) when the run ends for this rank.

A protocol outcome ends the run (`outcome`): 3 another rank failed or died (exit 1), 4 the run was stopped or
superseded (exit 143), 5 this rank was evicted (exit 1), 6 the run finished (exit 0), 2 bad input (exit 2).
With --num-nodes 1 a Node does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.barrier import (
    Arrival,
    BarrierResult,
    BarrierWait,
    arrivals,
    arrive,
    fail_barrier,
    open_barrier,
    wait_barrier,
    wait_open,
)
from coordinator.cluster import (
    Cluster,
    ClusterError,
    Endpoint,
    FailureRecord,
    FinishRecord,
    Incarnation,
    RankFailed,
    RunFinished,
    RunNotRunning,
    RunRecord,
    RunStopped,
    StopRequest,
)
from coordinator.driver import say
from coordinator.driver.ports import free_port
from coordinator.driver.procs import child_env
from coordinator.driver.startcheck import StartCheck
from coordinator.heartbeat import LivenessWatcher, PeerWatch
from coordinator.membership import default_addr, join_run, pid_started, start_run
from coordinator.protocol_cli import incarnation, protocol_root
from rollout_engine.defaults import (
    BARRIER_REPORT_S,
    DEAD_AFTER_S,
    HEARTBEAT_S,
    JOIN_WAIT_S,
    START_SPREAD_S,
)
from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.layout import Layout, rank_file_name

if TYPE_CHECKING:
    from coordinator.driver.cli import Args
    from coordinator.driver.procs import Groups
    from coordinator.driver.supervise import Child, Supervisor

#: from this many nodes on, the nodes' starts are spread over START_SPREAD_S unless BATON_START_SPREAD_S says otherwise
SPREAD_FROM_NODES = 64
#: how often a barrier or a join looks
POLL_S = 0.2
#: how often the master looks whether every rank joined (`members`)
MEMBERS_POLL_S = 0.5
#: how often a node in a training looks whether a partner's part failed (s): against a wait of launch.timeout_s
PARTNERS_S = 2.0
#: a worker waiting for the master's decision reports every ... (`receive`)
RECEIVE_REPORT_S = 600.0
#: a heartbeat that exits while the node runs is started again this many times; the next exit stops the node
BEAT_RESTARTS = 3
#: seconds the heartbeat has to stop on SIGTERM at the end (run.cleanup, through `stop_heartbeat`)
BEAT_GRACE_S = 5


def start_delay(rank: int, num_nodes: int, env: Mapping[str, str] = os.environ) -> float:
    """Seconds rank `rank` of `num_nodes` waits before it makes its first name on the log path: rank r waits
    spread * r / N, so that about N / spread nodes start in any second. A node makes about 12 names at its start
    (docs/multinode.md, Scale), so a spread of 60 s keeps the start within N/5 creates and renames a second, a
    metadata server's costly operations. The spread is BATON_START_SPREAD_S; unset, 60 s from SPREAD_FROM_NODES
    nodes on and none below, where a start's few hundred names are one second's work for any server."""
    return spread_s(num_nodes, env) * rank / num_nodes if num_nodes > 1 else 0.0


def spread_s(num_nodes: int, env: Mapping[str, str] = os.environ) -> int:
    """The spread of N nodes' starts: BATON_START_SPREAD_S, or unset its default from SPREAD_FROM_NODES on."""
    if START_SPREAD_S.given(env) or num_nodes >= SPREAD_FROM_NODES:
        return START_SPREAD_S.value(env)
    return 0


def spread_start(rank: int, num_nodes: int, sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait this node's share of the spread start (start_delay), saying so: before its claims, so that a
    signal meanwhile ends it with nothing written."""
    delay = start_delay(rank, num_nodes)
    if delay <= 0:
        return
    spread = spread_s(num_nodes)
    say.log(
        f"rank {rank} of {num_nodes}: starting in {delay:.1f}s, the nodes' starts spread over {spread}s to spare the "
        f"shared filesystem's metadata server ({START_SPREAD_S.env}; docs/multinode.md)"
    )
    sleep(delay)


def this_incarnation() -> Incarnation:
    """This process's registration: (host, pid, start time of the pid)."""
    return (socket.gethostname(), os.getpid(), pid_started(os.getpid()))


def incarnation_text(me: Incarnation) -> str:
    """`host:pid:started`, as a plan's `m_<r>` names a registration."""
    return ":".join(map(str, me))


@dataclass(frozen=True)
class Members:
    """Who is in a step (the master's view, or a plan's): the ranks, the step's weights (the run's; 0 for a
    rank that is out), and each member's registration (a continue run plans with these: `Node.plan_members`)."""

    ranks: list[int]
    weights: list[int]
    incarnations: dict[int, Incarnation]

    def data(self) -> dict[str, str]:
        """The plan's keys, as run.sh published them: members and weights as csv, `m_<r>` = host:pid:started."""
        found = {"members": _csv(self.ranks), "weights": _csv(self.weights)}
        return found | {f"m_{rank}": incarnation_text(me) for rank, me in sorted(self.incarnations.items())}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Members:
        """The members a published plan names (`data()`'s keys; missing ones are empty)."""
        mine = {int(key[2:]): incarnation(str(value)) for key, value in data.items() if key.startswith("m_")}
        return cls(_ints(data.get("members", "")), _ints(data.get("weights", "")), mine)


@dataclass(frozen=True)
class Synced:
    """What a barrier brought: each arrived rank's data, and the ranks it went on without (continue runs)."""

    data: dict[int, dict[str, Any]]
    gone: list[int] = field(default_factory=list)

    def merged(self) -> dict[str, Any]:
        """Every arrival's data in rank order, a later rank's key over an earlier one's, and `gone` (csv) when
        ranks were dropped."""
        merged: dict[str, Any] = {}
        for rank in sorted(self.data):
            merged |= self.data[rank]
        if self.gone:
            merged["gone"] = _csv(self.gone)
        return merged


@dataclass
class Node:
    """This node's part of a multi-node run ; every method is a no-op on one node."""

    args: Args
    run_dir: Path
    groups: Groups
    supervisor: Supervisor
    root: str
    app_py: str
    vllm_port: int
    run_id: str = ""
    master_addr: str = ""
    torchrun_port: int = 0
    on_failure: str = "abort"
    #: the workers of the current step (continue mode): rank -> the registration it was planned with
    planned: dict[int, Incarnation] = field(default_factory=dict)
    #: this node's registration (host, pid, start time)
    me: Incarnation = field(default_factory=this_incarnation)
    _beat: Child | None = field(default=None, init=False, repr=False)
    _beat_restarts: int = field(default=0, init=False, repr=False)
    _partner: Callable[[], None] | None = field(default=None, init=False, repr=False)
    #: a protocol outcome stopped this node (`outcome` 4): its way out writes no stop request or failure
    _stopped: bool = field(default=False, init=False, repr=False)
    _record: RunRecord | None = field(default=None, init=False, repr=False)
    #: the master: the rank whose loss ended the run, as its failure flag tells the workers
    _lost: str = field(default="", init=False, repr=False)
    #: the shared-filesystem check at the start (coordinator/driver/startcheck.py)
    _fscheck: StartCheck | None = field(default=None, init=False, repr=False)

    @property
    def multi(self) -> bool:
        return self.args.num_nodes > 1

    @property
    def is_master(self) -> bool:
        """Rank 0 (and a single node): the rank that decides and records."""
        return self.args.rank == 0

    @property
    def continue_mode(self) -> bool:
        """A run that goes on without a failed worker (the master's --on-rank-failure continue)."""
        return self.multi and self.on_failure == "continue"

    @property
    def group(self) -> str | None:
        """The protocol group: None for --rl-phase both (<log>/cluster/), else the phase: a split deployment's
        rollout run and update run on one log path coordinate apart (<log>/roles/<phase>/cluster/)."""
        return None if self.args.phase == "both" else self.args.phase

    @property
    def protocol_root(self) -> Path:
        return protocol_root(self.args.log, self.group)

    @property
    def beat_name(self) -> str:
        """The heartbeat's group name: a split deployment's two runs share this rank's run directory."""
        return "heartbeat" if self.group is None else f"heartbeat-{self.group}"

    @property
    def ended_file(self) -> Path:
        """Where the heartbeat writes `<code>\\t<reason>` before it SIGTERMs this node."""
        return self.run_dir / ("ended" if self.group is None else f"ended-{self.group}")

    # -- start ------------------------------------------------------------------------------------------------

    def start(self, start_iteration: int) -> None:
        """The master starts a run (a new run id fences earlier runs' files off); a worker waits for a master
        it sees beating and joins. Then the run's id goes to every process this node starts (BATON_RUN_ID,
        BATON_RUN_FENCE) and the heartbeat runs beside the node, watched at every tick of the supervisor."""
        self.run_id, self.master_addr, self.torchrun_port, self.on_failure, self.planned = "", "", 0, "abort", {}
        self._lost = ""
        self._beat = None
        if not self.multi:
            return
        verb = "start" if self.is_master else "join"
        with self._protocol(f"could not {verb} the multi-node run"):
            record = self._start_run(start_iteration) if self.is_master else self._join_run()
        self._adopt(record)
        self._export_fence()
        with contextlib.suppress(FileNotFoundError):
            self.ended_file.unlink()
        self._beat_restarts = 0
        self._start_beat()
        self.supervisor.add(self.beat_check)
        group = "" if self.group is None else f" --group {self.group}"
        say.log(
            f"rank {self.args.rank} of {self.args.num_nodes}: run {self.run_id}, master {self.master_addr}"
            f" (torchrun port {self.torchrun_port or ''});"
            f" status: python -m coordinator status --log-path {self.args.log}{group}"
        )
        self._fscheck = StartCheck.begin(self._cluster(), self._run_record())
        if self._fscheck is not None:
            self.supervisor.add(self._fscheck.watch)

    def _start_run(self, start_iteration: int) -> RunRecord:
        return start_run(
            self.protocol_root,
            self.args.num_nodes,
            self.args.weights,
            me=self._endpoint(),
            started=self.me[2],
            vllm_port=self.vllm_port,
            torchrun_port=free_port(avoid={self.vllm_port}),
            start_iteration=start_iteration,
            on_rank_failure=self.args.on_failure,
            heartbeat_interval_s=HEARTBEAT_S.seconds(),
            dead_after_s=DEAD_AFTER_S.seconds(),
            poll_s=POLL_S,
            on_wait=say.log,
            on_poll=self.supervisor.tick,
        )

    def _join_run(self) -> RunRecord:
        rank, wait_s = self.args.rank, JOIN_WAIT_S.value()
        say.log(f"rank {rank}: waiting for the master (rank 0) on {self.args.log} (at most {wait_s}s)")
        return join_run(
            self.protocol_root,
            rank,
            self.args.num_nodes,
            self.args.weights,
            wait_s,
            me=self._endpoint(),
            started=self.me[2],
            vllm_port=self.vllm_port,
            poll_s=POLL_S,
            on_wait=lambda line: say.log(f"rank {rank}: {line}"),
            on_poll=self.supervisor.tick,
        )

    def _endpoint(self) -> Endpoint:
        return Endpoint(self.me[0], self.args.node_addr or default_addr(), self.me[1])

    def _adopt(self, record: RunRecord) -> None:
        self._record = record
        self.run_id, self.master_addr = record.run_id, record.master.addr
        self.torchrun_port, self.on_failure = record.torchrun_port or 0, record.on_rank_failure

    def _export_fence(self) -> None:
        """Every process this node starts from now on writes into the log path only while this run is the one
        the run record names (rollout_engine/fence.py): a newer master's start fences an older run's node off."""
        os.environ["BATON_RUN_ID"] = self.run_id
        os.environ["BATON_RUN_FENCE"] = str(Layout(self.protocol_root).run_record)

    # -- the heartbeat ----------------------------------------------------------------------------------------

    def _start_beat(self) -> None:
        group = [] if self.group is None else ["--group", self.group]
        cmd = [self.app_py, "-m", "coordinator", "heartbeat", "--log-path", self.args.log, *group]
        cmd += ["--run-id", self.run_id, "--rank", str(self.args.rank), "--node-pid", str(os.getpid())]
        cmd += ["--stop-node", "--reason-file", str(self.ended_file)]
        # its few lines (an eviction, a failure) go to this node's output, where the user looks: a log of its own
        # was one more name on the shared path at every node's start
        self._beat = self.groups.start(self.beat_name, cmd, None, child_env(self.root))

    def beat_check(self) -> None:
        """A supervisor watch: when this node's heartbeat exited (killed, crashed) while the node runs, start it
        again at once (it goes on from its last beat): without it the other ranks count this node dead after
        dead_after_s while it works on. The 4th exit stops the node (exit 1). A heartbeat that ended the node
        on purpose (its reason written, its SIGTERM on the way) is not started again."""
        if self._beat is None:
            return
        code = self._beat.poll()
        if code is None:
            return
        self._beat = None
        if self.ended() is not None:
            return
        how = _how(code)
        rank = self.args.rank
        if self._beat_restarts >= BEAT_RESTARTS:
            raise say.Die(
                1,
                f"the heartbeat of rank {rank} exited ({how}) a 4th time (its output, if any, is above); without it the"
                " other ranks count this node dead: stopping it. Start it again with --resume (docs/multinode.md)",
            )
        self._beat_restarts += 1
        say.warn(
            f"the heartbeat of rank {rank} exited ({how}) while this node runs; starting it again"
            f" ({self._beat_restarts} of {BEAT_RESTARTS}) before the other ranks count this node dead"
        )
        self._start_beat()

    def stop_heartbeat(self) -> None:
        """The clean-up's last step (after `leave` and the other groups): stop the heartbeat group."""
        self.supervisor.remove(self.beat_check)
        self._beat = None
        if self.run_id:
            self.groups.stop(self.beat_name, BEAT_GRACE_S)

    def ended(self) -> tuple[int, str] | None:
        """Why the heartbeat stopped this node (its reason file: code, reason), if it did."""
        try:
            text = self.ended_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        if not text:
            return None
        code, _, reason = text.rstrip("\n").partition("\t")
        return (int(code) if code.strip().isdigit() else -1, reason)

    # -- the run's state ---------------------------------------------------------------------------------------

    def fence(self, what: str) -> None:
        """Before the master writes the run's state (run/state): once a newer master's start superseded this
        run, this node writes nothing more there and stops (exit 143, as a stopped run)."""
        if not self.run_id:
            return
        with self._protocol(what):
            newer = self._cluster().superseded_by()
            if newer is not None:
                raise RunStopped(f"run {self.run_id} was superseded by run {newer.run_id} (master {newer.master.host})")

    def members(self, step: int, planned: dict[int, Incarnation] | None = None) -> Members:
        """The master's view of who is in `step`: every rank (abort), or the ranks registered and not evicted
        (continue; with `planned`, those of a step's planned workers not evicted since: {} for none). On the
        first step of a continue run it first waits (BATON_JOIN_WAIT_S) for every rank to join."""
        weights = list(self.args.weights)
        if not self.multi:
            return Members(list(range(self.args.num_nodes)), weights, {})
        wait_s = JOIN_WAIT_S.value() if step == 1 else 0
        with self._protocol(f"reading the members of step {step}"):
            return self._members(wait_s, planned)

    def _members(self, wait_s: float, planned: dict[int, Incarnation] | None) -> Members:
        cluster, record = Cluster(self.protocol_root, self.run_id, rank=0), self._run_record()
        ranks = list(range(record.num_nodes))
        members = ranks
        if record.on_rank_failure == "continue":
            end = self.supervisor.clock() + wait_s
            # every rank registered (the master's registration is one of them)
            while len(cluster.nodes()) < record.num_nodes and self.supervisor.clock() < end:
                self.supervisor.sleep(MEMBERS_POLL_S)
            members = cluster.members(record.num_nodes, planned)
        nodes = cluster.nodes()
        weights = [w if rank in members else 0 for rank, w in zip(ranks, record.rank_weights, strict=True)]
        mine = {rank: nodes[rank].incarnation for rank in members if rank in nodes}
        return Members(list(members), weights, mine)

    def plan_members(self, members: Members) -> None:
        """Plan the current step with `members`' workers (a plan's, or `members()`'): its barriers wait for
        these, never for a worker that joined since (that one skips the step and is planned into the next)."""
        self.planned = {rank: me for rank, me in members.incarnations.items() if rank != 0}

    # -- barriers ----------------------------------------------------------------------------------------------

    def sync(self, iteration: int, phase: str, data: dict[str, Any] | None = None) -> Synced:
        """Arrive at the barrier (with `data` for the others), then wait until every rank has, while they
        live (continue mode: the ranks the step was planned with)."""
        if not self.multi:
            return Synced({})
        with self._protocol(f"arriving at the {phase} barrier of iteration {iteration}"):
            arrive(self._cluster(), iteration, phase, pid=self.me[1], data=data)
        return self._wait(iteration, phase, None, BARRIER_REPORT_S)

    def publish(self, step: int, phase: str, data: dict[str, Any]) -> None:
        """The master tells every rank what it decided (its arrival at the step's `phase` barrier)."""
        if not self.multi:
            return
        with self._protocol(f"publishing the {phase} of step {step}"):
            arrive(Cluster(self.protocol_root, self.run_id, rank=0), step, phase, pid=self.me[1], data=data)

    def receive(self, step: int, phase: str) -> dict[str, Any]:
        """A worker waits for the master's decision (`publish`) and returns it."""
        if not self.multi:
            return {}
        return self._wait(step, phase, [0], RECEIVE_REPORT_S).merged()

    def _wait(self, iteration: int, phase: str, ranks: list[int] | None, report_s: float) -> Synced:
        with self._protocol(f"the {phase} barrier of iteration {iteration}"):
            result = self._barrier(iteration, phase, ranks, report_s)
        return Synced({rank: result.arrivals[rank].data for rank in result.ranks}, list(result.gone))

    def _barrier(self, iteration: int, phase: str, ranks: list[int] | None, report_s: float) -> BarrierResult:
        """Wait at a barrier: every rank of `ranks` (default: all); a continue run waits for the workers its
        step was planned with (none: {}), never for one that joined since; a lost worker is dropped, only the
        master's loss ends the wait. A barrier of every rank: the master waits for them and opens it, a worker
        waits for the master's word (coordinator/barrier.py: two tiers)."""
        cluster, record, rank = self._cluster(), self._run_record(), self.args.rank
        expected = list(range(record.num_nodes)) if ranks is None else ranks
        continuing, planned = record.on_rank_failure == "continue", dict(self.planned)
        if continuing:
            expected = [r for r in expected if r in (0, rank) or r in planned]

        def tick(progress: BarrierWait) -> None:
            missing = ", ".join(str(r) for r in progress.missing)
            waiting = f"ranks {missing}" if self.is_master or ranks is not None else "the master to see every rank"
            say.log(f"rank {rank}: {phase} of iteration {iteration}: waiting for {waiting} ({progress.waited_s:.0f} s)")

        if ranks is None and not self.is_master:
            master = LivenessWatcher(cluster, [0], record.dead_after_s)
            result = wait_open(
                cluster,
                iteration,
                phase,
                master,
                poll_s=POLL_S,
                on_tick=tick,
                tick_s=report_s,
                on_poll=self.supervisor.tick,
            )
            self._say_gone(cluster, iteration, phase, result)
            return result
        watcher = LivenessWatcher(cluster, expected, record.dead_after_s)
        membership: dict[str, Any] = {}
        if continuing:
            peers = PeerWatch(cluster, list(range(record.num_nodes)), record.dead_after_s, "continue")
            membership = {"drop": lambda missing: peers.drop(missing, planned), "fatal": [0]}
        try:
            result = wait_barrier(
                cluster,
                iteration,
                phase,
                expected,
                watcher,
                poll_s=POLL_S,
                on_tick=tick,
                tick_s=report_s,
                on_poll=self.supervisor.tick,
                **membership,
            )
        except RankFailed as failed:
            if ranks is None:  # the workers waiting at it stop at their next poll
                reason = str(failed)
                self._quietly(lambda: fail_barrier(cluster, iteration, phase, reason))
            raise
        if ranks is None:
            open_barrier(cluster, result)
        self._say_gone(cluster, iteration, phase, result)
        return result

    def _say_gone(self, cluster: Cluster, iteration: int, phase: str, result: BarrierResult) -> None:
        if result.gone:
            evictions = cluster.evictions()
            why = "; ".join(f"rank {r} evicted: {evictions[r].reason}" for r in result.gone if r in evictions)
            say.log(
                f"rank {self.args.rank}: {phase} of iteration {iteration}: going on without ranks {result.gone} ({why})"
            )

    # -- a training's partners ---------------------------------------------------------------------------------

    def watch_partners(self, iteration: int, on_failed: Callable[[int, int], None]) -> None:
        """While this node runs its part of the training of `iteration`: a node whose part failed arrives at the
        update barrier with train_exit != 0, and as its torchrun is gone, this node's part would wait for it
        until launch.timeout_s (3600 s). So every PARTNERS_S (of the supervisor's ticks) it looks: on a failed
        part, warn and call `on_failed(rank, exit code)` once (it stops this node's part). The master looks at
        every rank's arrival, a worker at the master's only (`failed_partner`)."""
        self.unwatch_partners()
        if not self.multi:
            return
        cluster, me, clock = self._cluster(), self.args.rank, self.supervisor.clock
        known: dict[int, Arrival] = {}
        last: list[float] = []

        def watch() -> None:
            if last and clock() - last[0] < PARTNERS_S:
                return
            last[:] = [clock()]
            try:
                failed = failed_partner(cluster, iteration, me, known)
            except (OSError, ValueError):  # an unreadable arrival: the next look tries again
                return
            if failed is not None:
                rank, value = failed
                self.unwatch_partners()
                say.warn(
                    f"the update of iteration {iteration}: rank {rank}'s part of the training failed"
                    f" (exit {value}); it cannot finish without it: stopping this node's part instead of"
                    " waiting for it"
                )
                on_failed(rank, _exit_code(value))

        self._partner = watch
        self.supervisor.add(watch)

    def unwatch_partners(self) -> None:
        if self._partner is not None:
            self.supervisor.remove(self._partner)
        self._partner = None

    # -- the way out -------------------------------------------------------------------------------------------

    def leave(self, rc: int, *, iteration: int, phase: str, last_error: str) -> int:
        """The clean-up's part (run.cleanup calls it); returns the code the run exits with. Why the heartbeat ended
        this node decides it; else a master whose run ended well says so (finished.json: a node still running
        stops with exit 0 rather than take the master's silence for its death); a SIGINT/SIGTERM on the master
        (or on any node of a Slurm step) asks the whole run to stop; any other failure of this node is flagged
        so that the others stop at once instead of at their next barrier."""
        self.unwatch_partners()
        if self._fscheck is not None:
            self._fscheck.stop()
            self.supervisor.remove(self._fscheck.watch)
        if not self.run_id:
            return rc
        ended = self.ended()
        if ended is not None:
            code, reason = ended
            if code == Exit.RANK_FAILED and self.is_master and not self._stopped:
                # the workers watch only the master: its failure flag is how they learn of the other rank's
                self._quietly(lambda: self._fail(iteration, phase or "run", reason, 1))
            return int(_ended_exit(rc, code, reason))
        if rc == 0 and self.is_master:
            self._finish()
        elif rc in (Exit.SIGINT, Exit.SIGTERM) and (self.is_master or slurm_in_step()) and not self._stopped:
            reason = self._stop_reason(rc)
            say.log(f"{reason}: every node of the run stops; continue it with --resume")
            self._quietly(lambda: self._request_stop(reason))
        elif rc != 0 and not self._stopped:
            reason = {Exit.SIGINT: "stopped by SIGINT", Exit.SIGTERM: "stopped by SIGTERM"}.get(rc, "")
            reason = reason or self._lost or last_error or f"run.sh exited {rc}"
            self._quietly(lambda: self._fail(iteration, phase or "run", reason, rc))
        return rc

    def _finish(self) -> None:
        reason = "the master (rank 0) ran the run's last step and exited"
        try:
            self._cluster().finish(FinishRecord(reason, self.me[0], self.me[1]))
        except OSError as exc:
            say.log(f"error: {exc}")
            say.warn("could not write the run's finished.json; a node still running will take the master for dead")

    def _stop_reason(self, rc: int) -> str:
        reason = "SIGINT on" if rc == Exit.SIGINT else "SIGTERM on"
        reason += " the master" if self.is_master else f" rank {self.args.rank}"
        if slurm_in_step():
            job = os.environ.get("SLURM_JOB_ID") or "?"
            reason += f" (Slurm job {job}: scancel, the time limit or a requeue)"
        return reason

    def _request_stop(self, reason: str) -> None:
        """`coordinator stop` (no rank: as run.sh asked it): the first request's reason is the one kept."""
        cluster = self._cluster()
        if cluster.stop_request() is None:
            cluster.request_stop(StopRequest(reason, None, self.me[0], self.me[1]))

    def _fail(self, iteration: int, phase: str, reason: str, rc: int) -> None:
        failure = FailureRecord(self.args.rank, iteration, phase, reason, rc, self.me[0], self.me[1])
        self._cluster().fail(replace(failure, started=self.me[2]))

    @staticmethod
    def _quietly(write: Callable[[], None]) -> None:
        """A write on the way out that must not stop the way out (run.sh: `2>/dev/null || true`)."""
        with contextlib.suppress(OSError, ConfigError, ClusterError):
            write()

    # -- helpers -----------------------------------------------------------------------------------------------

    def _cluster(self) -> Cluster:
        return Cluster(self.protocol_root, self.run_id, rank=self.args.rank)

    def _run_record(self) -> RunRecord:
        """The run's record (kept from the start; read again when unknown)."""
        if self._record is None:
            record = self._cluster().record()
            if record is None:
                raise ConfigError(f"--run-id {self.run_id} names no run on {self.protocol_root}")
            self._record = record
        return self._record

    @contextlib.contextmanager
    def _protocol(self, what: str) -> Iterator[None]:
        """Protocol calls as `python -m coordinator` made them: their problems on stderr as its lines, then
        the run ends with `outcome` for `what`."""
        try:
            yield
        except ConfigError as exc:
            for problem in exc.problems:
                say.log(f"error: {problem}")
            raise self.outcome(Exit.BAD_INPUT, what) from exc
        except ClusterError as exc:
            say.log(f"{'' if isinstance(exc, (RunFinished, RunNotRunning)) else 'error: '}{exc}")
            if isinstance(exc, RankFailed) and self.is_master:
                self._lost = str(exc)  # the failure flag the workers read names the rank (leave)
            raise self.outcome(exc.exit_code, what) from exc
        except OSError as exc:
            say.log(f"error: {exc}")
            raise self.outcome(Exit.FAILED, what) from exc

    def outcome(self, code: int, what: str) -> say.Ended:
        """The exception that ends this node after protocol outcome `code` during `what`."""
        if code == Exit.RANK_FAILED:
            return say.Die(
                1,
                f"{what}: another rank failed or died (above); stopping this node. Fix it, then start every node"
                " again with --resume",
            )
        if code == Exit.RUN_STOPPED:
            self._stopped = True
            return say.Ended(int(Exit.SIGTERM), f"the run was asked to stop ({what}); this node stops")
        if code == Exit.EVICTED:
            return say.Die(
                1,
                f"{what}: this rank was evicted by the master (declared dead); restart it with --resume to join again",
            )
        if code == Exit.RUN_FINISHED:
            return say.Ended(0, f"{what}: the run finished (the master ran its last step and exited); this node stops")
        if code == Exit.BAD_INPUT:
            return say.Die(2, f"{what}: bad input (above)")
        return say.Die(1, f"{what} failed (exit {code})")


def failed_partner(cluster: Cluster, iteration: int, me: int, known: dict[int, Arrival]) -> tuple[int, Any] | None:
    """The first other rank that arrived at `iteration`'s update barrier with a failed part (rank, train_exit).
    The master lists the barrier and reads each new arrival once (`known` keeps those read); a worker reads the
    master's arrival alone, by name: a worker's part failing stops the master's part, whose arrival then says
    so, so each worker looks at one file whatever the number of nodes (2N² reads a second across the cluster
    when every node read every arrival)."""
    if me == 0:
        known.update(arrivals(cluster, iteration, "update", known, want=(), by_name=False))
    else:
        path = cluster.barrier_dir(iteration, "update") / rank_file_name(0, ".json")
        try:
            known[0] = Arrival(**json.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
    for rank, arrival in sorted(known.items()):
        value = arrival.data.get("train_exit")
        if rank != me and value not in (None, 0, "0", ""):
            return rank, value
    return None


def _ended_exit(rc: int, code: int, reason: str) -> int:
    """The exit code, and the line, of a node its heartbeat ended with `code` and `reason`."""
    if code == Exit.RUN_STOPPED:
        say.log(f"stopped: {reason}")
        return Exit.SIGTERM
    if code == Exit.RANK_FAILED:
        say.warn(f"stopping this node: {reason}; start every node again with --resume once it is fixed")
        return 1
    if code == Exit.EVICTED:
        say.warn(f"this rank was evicted: {reason}")
        return 1
    if code == Exit.RUN_FINISHED:
        say.log(f"{reason}; this node stops")
        return 0
    return rc


def slurm_in_step() -> bool:
    """A task of a Slurm job step (srun): a batch script's own shell has SLURM_PROCID but no step id.
    (cli.py has the same test; this one keeps nodes.py free of the command line's module.)"""
    step = os.environ.get("SLURM_STEP_ID", "")
    return bool(step and os.environ.get("SLURM_PROCID", "")) and step != "batch"


def _how(code: int) -> str:
    """How a process exited: `exit N`, or `killed by SIGNAME` (a code above 128, or a negative Popen one)."""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(signum).name}"
    return f"exit {code}"


def _exit_code(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 1


def _csv(values: list[int]) -> str:
    return ",".join(map(str, values))


def _ints(value: object) -> list[int]:
    """`0,2` (or a list) as ints; empty for none."""
    items = value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]
    return [int(v) for v in items]
