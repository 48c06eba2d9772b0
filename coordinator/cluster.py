"""The multi-node protocol's files on the shared log path: paths, records, errors.

    cluster = Cluster(log, run_id, rank=1)      # start and join: coordinator.membership
    cluster.fail(FailureRecord(...)); cluster.request_stop(StopRequest(...)); cluster.evict(Eviction(...))
    cluster.finish(FinishRecord(...))           # the master, on its way out of a run that ended well

Files under <log>/cluster/ (their paths: rollout_engine.layout `Layout.cluster`, `ClusterRun`):

    run.json                                   RunRecord, rewritten by every master start
    runs/<run_id>/run.json                     the same record, kept with its run
    pinned.json                                Pinned: num_nodes and rank_weights of the experiment, written once
    runs/<run_id>/nodes/rank_<r>.json          NodeRecord: a rank's registration
    runs/<run_id>/heartbeat/rank_<r>           "seq wall_time host pid" (coordinator.heartbeat)
    runs/<run_id>/barriers/iter_NNNN/<phase>/rank_<r>.json   arrivals (coordinator.barrier)
    runs/<run_id>/failed/rank_<r>.json         FailureRecord: written by a rank on its way out
    runs/<run_id>/stop.json                    StopRequest: stop the whole run
    runs/<run_id>/finished.json                FinishRecord: the master ran the last step and exited
    runs/<run_id>/evicted/rank_<r>.json        Eviction: the master declared the rank dead

Every file is written with rollout_engine.files (temp file + rename): a reader
sees a whole file or none, and names starting with "." (temp files) are never
read. Every master start gets a new run_id, which fences the files of earlier
runs: nothing reads another run's directory. Waiters list directories instead
of stat-ing expected names (NFS caches negative lookups). Whether a master is
alive is judged by watching its heartbeat change on this host's monotonic
clock, never by comparing another host's wall time with ours.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine.errors import BatonError
from rollout_engine.exits import Exit
from rollout_engine.fence import read_run_record
from rollout_engine.files import save_json
from rollout_engine.layout import ClusterRun, Layout, rank_file_name
from rollout_engine.shared_read import exists_either_way, read_fresh

ON_RANK_FAILURE = ("abort", "continue")
RANK_FILE = re.compile(r"rank_(\d+)(\.json)?")


class ClusterError(BatonError):
    """An outcome of the protocol that ends this node's part of the run; `exit_code` is the CLI's."""

    exit_code = Exit.FAILED


class RankFailed(ClusterError):
    """A rank this node waits for wrote a failure flag, was evicted, or stopped beating."""

    exit_code = Exit.RANK_FAILED

    def __init__(self, rank: int, reason: str) -> None:
        self.rank, self.reason = rank, reason
        super().__init__(f"rank {rank}: {reason}")


class RunStopped(ClusterError):
    """The run was asked to stop (stop.json), or a newer master start superseded it."""

    exit_code = Exit.RUN_STOPPED

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"run stopped: {reason}")


class RunNotRunning(ClusterError):
    """The run that run.json names is not running (it finished, was stopped, or its master is gone): there is
    nothing to ask to stop."""

    exit_code = Exit.RUN_NOT_RUNNING


class Evicted(ClusterError):
    """The master declared this node's rank dead: it must stop even though it runs."""

    exit_code = Exit.EVICTED

    def __init__(self, rank: int, reason: str) -> None:
        self.rank, self.reason = rank, reason
        super().__init__(f"rank {rank} was evicted: {reason}")


class RunFinished(ClusterError):
    """The master ran the run's last step and exited (finished.json): a node still running has nothing left
    to do, and the master's silence is no death."""

    exit_code = Exit.RUN_FINISHED

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the run finished: {reason}")


class MasterAlive(ClusterError):
    """Another master is running on this log path."""


class JoinTimeout(ClusterError):
    """No live master appeared within the join's wait."""


@dataclass(frozen=True)
class Endpoint:
    """A process on a host: who the master is, who wrote a flag."""

    host: str
    addr: str
    pid: int


@dataclass(frozen=True)
class RunRecord:
    """run.json: the run every node of this start of the experiment belongs to."""

    run_id: str
    created: float  # wall time of the master's host, for people; never compared across hosts
    num_nodes: int
    rank_weights: list[int]
    master: Endpoint
    torchrun_port: int | None
    start_iteration: int
    on_rank_failure: str  # "abort" | "continue"
    heartbeat_interval_s: float
    dead_after_s: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        return cls(**{**data, "master": Endpoint(**data["master"])})


@dataclass(frozen=True)
class Pinned:
    """pinned.json: what every later start of this experiment must agree with."""

    num_nodes: int
    rank_weights: list[int]
    first_run_id: str
    created: float


#: one start of a node's process: (host, pid, start time of that pid on its host in clock ticks since boot; 0 when
#: unknown). A node restarted with the same host name and pid (a container) is another start: the time differs
Incarnation = tuple[str, int, int]


@dataclass(frozen=True)
class NodeRecord:
    """A rank's registration in its run."""

    rank: int
    host: str
    addr: str
    pid: int
    vllm_port: int | None
    joined: float
    started: int = 0  # the pid's start time on its host (clock ticks since boot): see Incarnation

    @property
    def incarnation(self) -> Incarnation:
        return (self.host, self.pid, self.started)


@dataclass(frozen=True)
class FailureRecord:
    """A rank's failure, written on its way out."""

    rank: int
    iteration: int
    phase: str
    reason: str
    exit_code: int
    host: str
    pid: int
    time: float = field(default_factory=time.time)
    started: int = 0  # the pid's start time on its host: the flag is this incarnation's (Incarnation)

    @property
    def incarnation(self) -> Incarnation:
        return (self.host, self.pid, self.started)


@dataclass(frozen=True)
class StopRequest:
    """A request to stop the whole run; `rank` is None when a person asked."""

    reason: str
    rank: int | None
    host: str
    pid: int
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class FinishRecord:
    """finished.json: the master's word, on its way out of a run that ended well, that no step is left."""

    reason: str
    host: str
    pid: int
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Eviction:
    """The master's verdict that a rank is dead: the incarnation registered then (`node_host`, `node_pid`,
    `node_started`: its run.sh; "" and 0 for any). A restarted rank registers anew and is no longer evicted,
    even with the same host name and pid (a container): its start time differs."""

    rank: int
    reason: str
    by_rank: int
    host: str
    pid: int
    time: float = field(default_factory=time.time)
    node_host: str = ""
    node_pid: int = 0
    node_started: int = 0

    def applies_to(self, node: NodeRecord | None) -> bool:
        """Does the verdict cover `node` (the rank's registration), or every incarnation?"""
        if self.node_pid == 0:
            return True
        return node is not None and node.incarnation == (self.node_host, self.node_pid, self.node_started)


def scan_ranks(directory: Path, expect: Iterable[int] = (), suffix: str = ".json") -> dict[int, Path]:
    """The `rank_<r>[.json]` files of `directory` by rank: one listing, then a lookup by name of each rank of
    `expect` the listing lacks (`rank_<r><suffix>`); temp files are skipped.

    No single way of looking sees a new file first on every filesystem: GlusterFS with NFS-like client caches
    caches a name's absence for its negative timeout but lists a new file at once, sshfs finds a new name at
    once but lists a directory up to 20 s late (docs/multinode.md "Filesystems"). Looking both ways sees it
    as soon as either does (and an open after the listing is not held up by the name's cached absence)."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        entries = []
    found = {}
    for entry in entries:
        match = RANK_FILE.fullmatch(entry.name)
        if match:
            found[int(match.group(1))] = Path(entry.path)
    for rank in expect:
        if rank not in found:
            path = directory / rank_file_name(rank, suffix)
            if path.exists():
                found[rank] = path
    return found


def load_json(path: Path, listing: bool = True) -> dict[str, Any] | None:
    """A JSON file written by this protocol, or None when it is not there (it may vanish between listing and read).
    Not found by name, it is looked for in a listing of its folder too (`read_fresh`), unless not `listing`."""
    try:
        return json.loads((read_fresh(path) if listing else path.read_bytes()).decode("utf-8"))
    except FileNotFoundError:
        return None


def load_run(log_path: str | Path) -> RunRecord | None:
    try:
        data = read_run_record(Layout(log_path).run_record)
    except FileNotFoundError:
        return None
    return RunRecord.from_dict(data)


def load_pinned(log_path: str | Path) -> Pinned | None:
    data = load_json(Layout(log_path).pinned)
    return None if data is None else Pinned(**data)


@dataclass(frozen=True)
class Cluster:
    """One run's directory, seen by one node (`rank`; None for an onlooker such as `status`)."""

    log_path: Path
    run_id: str
    rank: int | None = None
    #: this node's run.sh (host, pid, start time) when known: a registration of its rank by another one replaces it
    me: Incarnation | None = None

    @property
    def paths(self) -> ClusterRun:
        return Layout(self.log_path).cluster_run(self.run_id)

    @property
    def run_dir(self) -> Path:
        return self.paths.dir

    @property
    def heartbeat_dir(self) -> Path:
        return self.paths.heartbeat_dir

    def barrier_dir(self, iteration: int, phase: str) -> Path:
        return self.paths.barrier_dir(iteration, phase)

    def record(self) -> RunRecord | None:
        """This run's own copy of its run.json (the top-level one names only the newest run)."""
        try:
            return RunRecord.from_dict(read_run_record(self.paths.record))
        except FileNotFoundError:
            return None

    def expected_ranks(self) -> range:
        """The run's ranks, from its record (read once): each is also looked up by name where a listing lacks it."""
        return range(_num_nodes(self.paths.record))

    def heartbeat_files(self) -> dict[int, Path]:
        return scan_ranks(self.heartbeat_dir, self.expected_ranks(), "")

    def register(self, node: NodeRecord) -> None:
        save_json(self.paths.nodes_dir / rank_file_name(node.rank, ".json"), asdict(node))

    def nodes(self) -> dict[int, NodeRecord]:
        return _load_ranks(self.paths.nodes_dir, NodeRecord, self.expected_ranks())

    def node(self, rank: int) -> NodeRecord | None:
        """One rank's registration: its file alone (a waiter looks at itself every poll; nodes() reads them all)."""
        return _load_rank(self.paths.nodes_dir, rank, NodeRecord)

    def fail(self, failure: FailureRecord) -> None:
        save_json(self.paths.failed_dir / rank_file_name(failure.rank, ".json"), asdict(failure))

    def failures(self, by_name: bool = True) -> dict[int, FailureRecord]:
        """Every rank's failure flag: a listing, and (`by_name`) a lookup of each rank it lacks."""
        return _load_ranks(self.paths.failed_dir, FailureRecord, self.expected_ranks() if by_name else ())

    def failure(self, rank: int, listing: bool = True) -> FailureRecord | None:
        """One rank's failure flag, by name and (`listing`, where the name is not found) in a listing."""
        return _load_rank(self.paths.failed_dir, rank, FailureRecord, listing)

    def request_stop(self, request: StopRequest) -> None:
        save_json(self.paths.stop, asdict(request))

    def stop_request(self) -> StopRequest | None:
        data = load_json(self.paths.stop) if exists_either_way(self.paths.stop) else None
        return None if data is None else StopRequest(**data)

    def finish(self, record: FinishRecord) -> None:
        save_json(self.paths.finished, asdict(record))

    def finished(self) -> FinishRecord | None:
        data = load_json(self.paths.finished) if exists_either_way(self.paths.finished) else None
        return None if data is None else FinishRecord(**data)

    def evict(self, eviction: Eviction) -> None:
        save_json(self.paths.evicted_dir / rank_file_name(eviction.rank, ".json"), asdict(eviction))

    def evictions(self, by_name: bool = True) -> dict[int, Eviction]:
        """Every rank's eviction: a listing, and (`by_name`) a lookup of each rank it lacks."""
        return _load_ranks(self.paths.evicted_dir, Eviction, self.expected_ranks() if by_name else ())

    def eviction(self, rank: int) -> Eviction | None:
        return _load_rank(self.paths.evicted_dir, rank, Eviction)

    def evicted(self, rank: int, node: NodeRecord | None = None) -> Eviction | None:
        """The eviction that covers `node` (default: the rank's current registration), if any."""
        eviction = self.eviction(rank)
        if eviction is None:
            return None
        node = node if node is not None else self.node(rank)
        return eviction if eviction is not None and eviction.applies_to(node) else None

    def members(self, num_nodes: int, planned: dict[int, Incarnation] | None = None) -> list[int]:
        """The ranks in the run now: the master, and every registered rank whose registration is not evicted
        (a rank restarted after its eviction is a member again). With `planned` (rank -> the incarnation of
        the registration a step was planned with): those of them whose planned registration is not evicted."""
        nodes, evictions = self.nodes(), self.evictions()
        if planned is not None:
            nodes = {rank: planned_node(rank, incarnation) for rank, incarnation in planned.items()}
        return [
            rank
            for rank in range(num_nodes)
            if rank == 0 or (rank in nodes and not (rank in evictions and evictions[rank].applies_to(nodes[rank])))
        ]

    def superseded_by(self) -> RunRecord | None:
        """The newer run that run.json names, if a later master start replaced this run."""
        record = load_run(self.log_path)
        return record if record is not None and record.run_id != self.run_id else None

    def standing(self) -> Evicted | RunStopped | None:
        """Why this node must stop, if it must: this rank evicted, stop.json, or a newer run in run.json."""
        if self.rank is not None:  # this rank's own files only: every waiter looks at them every poll
            current = self.node(self.rank)
            if self.me is not None and current is not None and current.incarnation != self.me:
                return Evicted(
                    self.rank, f"rank {self.rank} was registered again, by {current.host} (pid {current.pid})"
                )
            mine = planned_node(self.rank, self.me) if self.me is not None else current
            eviction = self.evicted(self.rank, mine) if mine is not None else self.eviction(self.rank)
            if eviction is not None:
                return Evicted(self.rank, eviction.reason)
        request = self.stop_request()
        if request is not None:
            who = "a person" if request.rank is None else f"rank {request.rank}"
            return RunStopped(f"{who} on {request.host} asked: {request.reason}")
        newer = self.superseded_by()
        if newer is not None:
            return RunStopped(f"run {self.run_id} was superseded by run {newer.run_id} (master {newer.master.host})")
        return None

    def check_standing(self) -> None:
        """Raise what standing() returns."""
        ended = self.standing()
        if ended is not None:
            raise ended


#: the node count of each run record read (a run's record never changes)
_NODE_COUNTS: dict[Path, int] = {}


def _num_nodes(record: Path) -> int:
    if record not in _NODE_COUNTS:
        try:
            _NODE_COUNTS[record] = int(read_run_record(record)["num_nodes"])
        except (OSError, KeyError, TypeError, ValueError):
            return 0  # not written yet (or not this protocol's): the listing alone
    return _NODE_COUNTS[record]


def planned_node(rank: int, incarnation: Incarnation) -> NodeRecord:
    """The registration of `rank` by `incarnation`, as far as eviction goes (no address, port or join time)."""
    host, pid, started = incarnation
    return NodeRecord(rank, host, "", pid, None, 0.0, started)


def _load_rank(directory: Path, rank: int, kind: type, listing: bool = True) -> Any:
    data = load_json(directory / rank_file_name(rank, ".json"), listing)
    return None if data is None else kind(**data)


def _load_ranks(directory: Path, kind: type, expect: Iterable[int]) -> dict[int, Any]:
    loaded = {}
    for rank, path in scan_ranks(directory, expect).items():
        data = load_json(path)
        if data is not None:
            loaded[rank] = kind(**data)
    return loaded
