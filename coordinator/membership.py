"""How a multi-node run is started (by the master, rank 0) and joined (by a worker).

    rec = start_run(log, num_nodes=2, rank_weights=[1, 1], torchrun_port=29500)   # on node 0 (the master)
    # ... then `python -m coordinator heartbeat --run-id RUN --rank 0` beats beside it
    rec = join_run(log, rank=1, num_nodes=2, rank_weights=[1, 1], on_wait=print)  # on node 1

A worker joins only a master it has seen beat (its heartbeat changed while the
worker watched, on the worker's own clock): a run.json left by an earlier run
whose master is gone never fools it. A master start is refused while another
master of this log path beats, and when its node count or weights differ from
pinned.json. Files: coordinator.cluster.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from coordinator.cluster import (
    ON_RANK_FAILURE,
    Cluster,
    Endpoint,
    Incarnation,
    JoinTimeout,
    MasterAlive,
    NodeRecord,
    Pinned,
    RunRecord,
    load_pinned,
    load_run,
)
from coordinator.heartbeat import LivenessWatcher, read_beats
from rollout_engine.defaults import DEAD_AFTER_S, HEARTBEAT_S, JOIN_WAIT_S
from rollout_engine.errors import ConfigError
from rollout_engine.files import save_json
from rollout_engine.layout import Layout

MasterState = Literal["absent", "watching", "alive", "dead", "stopped"]


def default_addr() -> str:
    """This host's address on the network its default route uses (like `hostname -I`'s first); 127.0.0.1 without one.

    Connecting a UDP socket sends nothing: it only makes the kernel pick the outgoing interface.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def check_nodes(num_nodes: int, rank_weights: list[int]) -> list[str]:
    """The problems of a node count and its weights (one line each, naming the value and the fix)."""
    problems = []
    if num_nodes < 1:
        problems.append(f"num_nodes must be >= 1 (got {num_nodes})")
    if len(rank_weights) != num_nodes:
        problems.append(f"rank_weights needs exactly {num_nodes} values for num_nodes {num_nodes} (got {rank_weights})")
    if any(w < 1 for w in rank_weights):
        problems.append(f"rank_weights values must be integers >= 1 (got {rank_weights})")
    return problems


def _check_timing(heartbeat_interval_s: float, dead_after_s: float, on_rank_failure: str) -> list[str]:
    problems = []
    if heartbeat_interval_s <= 0:
        problems.append(f"heartbeat_interval_s must be > 0 (got {heartbeat_interval_s})")
    if dead_after_s < 2 * heartbeat_interval_s:
        problems.append(
            f"dead_after_s must be at least twice heartbeat_interval_s {heartbeat_interval_s} (got {dead_after_s});"
            " a live rank would look dead between two beats"
        )
    if on_rank_failure not in ON_RANK_FAILURE:
        problems.append(f"on_rank_failure must be one of {', '.join(ON_RANK_FAILURE)} (got {on_rank_failure!r})")
    return problems


class MasterWatch:
    """Is the master that run.json names alive? Judged by watching its heartbeat change, on this clock.

    `window_s` (default: that run's dead_after_s) is how long a heartbeat may stay unchanged
    before the master counts as gone. A new run_id in run.json restarts the watch.
    """

    def __init__(
        self, log_path: str | Path, window_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.log_path, self.window_s, self.clock = Path(log_path), window_s, clock
        self.record: RunRecord | None = None
        self._watcher: LivenessWatcher | None = None

    def poll(self) -> MasterState:
        """One look: "absent" (no run.json), "watching", "alive" or "dead"."""
        record = load_run(self.log_path)
        if record is None:
            return "absent"
        if self.record is None or record.run_id != self.record.run_id:
            self.record = record
            window = record.dead_after_s if self.window_s is None else self.window_s
            self._watcher = LivenessWatcher(Cluster(self.log_path, record.run_id), [0], window, self.clock)
        assert self._watcher is not None
        self._watcher.observe()
        if self._watcher.confirmed(0):
            return "alive"
        return "dead" if self._watcher.dead() else "watching"

    def gone_here(self) -> bool:
        """The master ran on this host, and it and its heartbeat process have both exited: no need to watch."""
        record, here = self.record, socket.gethostname()
        if record is None or record.master.host != here or pid_running(record.master.pid):
            return False
        beat = read_beats(Cluster(self.log_path, record.run_id), [0]).get(0)
        return beat is not None and beat.host == here and not pid_running(beat.pid)

    def stopped(self) -> bool:
        """The run that run.json names was asked to stop: not one to join."""
        return self.record is not None and Cluster(self.log_path, self.record.run_id).stop_request() is not None

    def describe(self, state: MasterState) -> str:
        run_json = Layout(self.log_path).run_record
        if state == "absent" or self.record is None:
            return f"waiting for a master to write {run_json}"
        rec = self.record
        who = f"run {rec.run_id} of master {rec.master.host} (pid {rec.master.pid})"
        if state == "dead":
            return f"{run_json} names {who}, whose heartbeat has stopped: waiting for a new master"
        if state == "stopped":
            return f"{run_json} names {who}, which was asked to stop: waiting for a new master"
        return f"{run_json} names {who}: watching its heartbeat to tell whether it runs"


def not_running(
    log_path: str | Path,
    *,
    poll_s: float = 0.2,
    on_wait: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Why the run that run.json names is not running, or None when it runs (its master seen beating).

    A run that finished, was asked to stop or whose master wrote its failure flag is over at once; a master
    that ran on this host and exited with its heartbeat too is gone at once; otherwise the master's heartbeat
    is watched on this clock for up to that run's dead_after_s (`on_wait` is told so once).
    """
    watch = MasterWatch(log_path, clock=clock)
    state = watch.poll()
    if state == "absent" or watch.record is None:
        return f"{Layout(log_path).run_record} names no run"
    master = f"its master {watch.record.master.host} (pid {watch.record.master.pid})"
    cluster = Cluster(Path(log_path), watch.record.run_id)
    if cluster.finished() is not None:
        return f"{master} ran its last step (finished.json)"
    if cluster.stop_request() is not None:
        return "it was asked to stop already (stop.json)"
    failure = cluster.failures().get(0)
    if failure is not None:
        return f"{master} failed in {failure.phase} of iteration {failure.iteration}: {failure.reason}"
    told = False
    while state == "watching" and not watch.gone_here():
        if on_wait is not None and not told:
            on_wait(watch.describe(state))
            told = True
        time.sleep(poll_s)
        state = watch.poll()
    if state == "alive":
        return None
    if state == "watching":  # gone_here
        return f"{master} and its heartbeat have exited on this host"
    return f"the heartbeat of {master} has not changed for {watch.record.dead_after_s:g} s"


def pid_running(pid: int) -> bool:
    """A process with this pid exists on this host (it may be another one if the pid was reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_started(pid: int) -> int:
    """When the process `pid` of this host started (clock ticks since boot, field 22 of /proc/<pid>/stat, as
    coordinator/driver/procs.py reads it); 0 when there is no such process. With the host and pid it names one
    start of a process: a container restarted with the same host name and pid started later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])  # the fields after the command name, which may hold spaces


def start_run(
    log_path: str | Path,
    num_nodes: int,
    rank_weights: list[int],
    *,
    me: Endpoint | None = None,
    started: int | None = None,
    vllm_port: int | None = None,
    torchrun_port: int | None = None,
    start_iteration: int = 0,
    on_rank_failure: str = "abort",
    heartbeat_interval_s: float = HEARTBEAT_S.default,
    dead_after_s: float = DEAD_AFTER_S.default,
    alive_window_s: float | None = None,
    poll_s: float = 0.2,
    on_wait: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_poll: Callable[[], None] | None = None,
) -> RunRecord:
    """Start a run as its master (rank 0): check, write run.json (new run_id), pinned.json once, register rank 0.

    Refused (ConfigError) when the values disagree with pinned.json; refused (MasterAlive) when
    the master that run.json names still beats, watched for up to `alive_window_s` (default: its
    dead_after_s). Then run.sh starts the heartbeat of rank 0. `me` (default: this process) registers as rank 0;
    `started` is its pid's start time (default: read here, pid_started). `on_poll` runs before every sleep
    of the watch (the driver's watches tick; what it raises ends the start).
    """
    problems = check_nodes(num_nodes, rank_weights) + _check_timing(heartbeat_interval_s, dead_after_s, on_rank_failure)
    if problems:
        raise ConfigError(problems)
    pinned = load_pinned(log_path)
    if pinned is not None and (pinned.num_nodes, pinned.rank_weights) != (num_nodes, list(rank_weights)):
        raise ConfigError(
            f"--num-nodes {num_nodes} --rank-weights {_csv(rank_weights)} differ from this experiment's"
            f" --num-nodes {pinned.num_nodes} --rank-weights {_csv(pinned.rank_weights)}"
            f" ({Layout(log_path).pinned}, run {pinned.first_run_id});"
            " start with the pinned values, or use a new --log-path"
        )
    _refuse_live_master(MasterWatch(log_path, alive_window_s, clock), poll_s, on_wait, on_poll)
    me = me or Endpoint(socket.gethostname(), default_addr(), os.getpid())
    record = RunRecord(
        run_id=uuid.uuid4().hex,
        created=time.time(),
        num_nodes=num_nodes,
        rank_weights=list(rank_weights),
        master=me,
        torchrun_port=torchrun_port,
        start_iteration=start_iteration,
        on_rank_failure=on_rank_failure,
        heartbeat_interval_s=heartbeat_interval_s,
        dead_after_s=dead_after_s,
    )
    if pinned is None:
        pin = Pinned(num_nodes, list(rank_weights), record.run_id, record.created)
        save_json(Layout(log_path).pinned, asdict(pin))
    cluster = Cluster(Path(log_path), record.run_id, rank=0)
    started = pid_started(me.pid) if started is None else started
    cluster.register(NodeRecord(0, me.host, me.addr, me.pid, vllm_port, record.created, started))
    save_json(cluster.paths.record, asdict(record))
    save_json(Layout(log_path).run_record, asdict(record))
    return record


def _refuse_live_master(
    watch: MasterWatch,
    poll_s: float,
    on_wait: Callable[[str], None] | None,
    on_poll: Callable[[], None] | None = None,
) -> None:
    told = False
    while (state := watch.poll()) == "watching" and not watch.gone_here():
        if on_wait is not None and not told:
            on_wait(watch.describe(state))
            told = True
        _pause(poll_s, on_poll)
    if state == "alive":
        rec = watch.record
        assert rec is not None
        raise MasterAlive(
            f"another master is running on {watch.log_path}: run {rec.run_id} of {rec.master.host}"
            f" (pid {rec.master.pid}) still beats; stop it first (python -m coordinator stop),"
            " or use another --log-path"
        )


def _csv(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


def join_run(
    log_path: str | Path,
    rank: int,
    num_nodes: int,
    rank_weights: list[int],
    wait_s: float = JOIN_WAIT_S.default,
    *,
    me: Endpoint | None = None,
    started: int | None = None,
    vllm_port: int | None = None,
    poll_s: float = 0.2,
    on_wait: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_poll: Callable[[], None] | None = None,
) -> RunRecord:
    """Join the run of the live master as `rank`; wait up to `wait_s` for one; register this node.

    A run.json left by a master that is gone never counts: the master must be seen beating.
    `on_wait` gets a line each time what we wait for changes. `me` (default: this process) and `started`
    (its pid's start time, default: read here) name this start of the node: an eviction of an earlier start
    with the same host name and pid (a restarted container) is not this one's. `on_poll` runs before every
    sleep of the waits (the driver's watches tick: a signal to the node ends the join at once).
    """
    problems = check_nodes(num_nodes, rank_weights)
    if num_nodes >= 2 and not 1 <= rank < num_nodes:
        problems.append(f"a worker's rank must be in 1..{num_nodes - 1} for num_nodes {num_nodes} (got {rank})")
    if num_nodes == 1:
        problems.append("num_nodes 1 has no workers to join (got num_nodes 1); a single node starts its own run")
    if problems:
        raise ConfigError(problems)
    watch, told, deadline = MasterWatch(log_path, clock=clock), "", clock() + wait_s
    while True:
        state = watch.poll()
        if state != "absent" and watch.stopped():
            state = "stopped"
        if state == "alive":
            break
        line = watch.describe(state)
        if on_wait is not None and line != told:
            on_wait(line)
        told = line
        if clock() >= deadline:
            raise JoinTimeout(f"no live master on {log_path} after {wait_s:g} s: {line}")
        _pause(poll_s, on_poll)
    record = watch.record
    assert record is not None
    if (record.num_nodes, record.rank_weights) != (num_nodes, list(rank_weights)):
        raise ConfigError(
            f"this node has --num-nodes {num_nodes} --rank-weights {_csv(rank_weights)} but the running master"
            f" ({record.master.host}, run {record.run_id}) has --num-nodes {record.num_nodes}"
            f" --rank-weights {_csv(record.rank_weights)}; give every node the same values"
        )
    me = me or Endpoint(socket.gethostname(), default_addr(), os.getpid())
    mine = (me.host, me.pid, pid_started(me.pid) if started is None else started)
    cluster = Cluster(Path(log_path), record.run_id, rank=rank, me=mine)
    if record.on_rank_failure == "continue":
        _await_eviction(cluster, rank, mine, record.dead_after_s * 2 + 10, poll_s, on_wait, clock, on_poll)
    _refuse_taken_rank(cluster, rank, mine)
    cluster.register(NodeRecord(rank, me.host, me.addr, me.pid, vllm_port, time.time(), mine[2]))
    cluster.check_standing()  # a stopped or superseded run (an eviction of an earlier incarnation is not ours)
    return record


def _await_eviction(
    cluster: Cluster,
    rank: int,
    me: Incarnation,
    wait_s: float,
    poll_s: float,
    on_wait: Callable[[str], None] | None,
    clock: Callable[[], float],
    on_poll: Callable[[], None] | None = None,
) -> None:
    """A continue run: a restarted rank whose earlier registration is not evicted yet waits (up to wait_s)
    for the master to evict it, so that every step knows which of the two it planned with."""
    deadline, told = clock() + wait_s, False
    while clock() < deadline:
        other = cluster.node(rank)  # by name: a join reads its own rank's registration, not all N
        if other is None or other.incarnation == me or cluster.evicted(rank, other) is not None:
            return
        if on_wait is not None and not told:
            on_wait(
                f"rank {rank} is still registered to {other.host} (pid {other.pid}): waiting for the master to evict it"
            )
            told = True
        _pause(poll_s, on_poll)


def _pause(poll_s: float, on_poll: Callable[[], None] | None) -> None:
    """One poll's pause of a wait: `on_poll` first (the caller's watches; what it raises ends the wait)."""
    if on_poll is not None:
        on_poll()
    time.sleep(poll_s)


def _refuse_taken_rank(cluster: Cluster, rank: int, me: Incarnation) -> None:
    """Two live nodes with one rank are an error; a rank whose registration was evicted may join again
    (it becomes a member at the master's next step: `Cluster.members`)."""
    other = cluster.node(rank)  # by name: a join reads its own rank's registration, not all N
    if other is not None and cluster.evicted(rank, other) is not None:
        return
    if other is not None and other.incarnation != me:
        raise ConfigError(
            f"rank {rank} already joined run {cluster.run_id} from {other.host} (pid {other.pid}): two nodes were"
            " given the same --worker rank, or this node restarted inside a live run; give each node its own rank,"
            " or restart every node"
        )
