"""Barriers of the multi-node protocol: every rank arrives, then waits for the others, as long as they live.

    cluster = Cluster(log, run_id, rank=1)
    arrive(cluster, iteration=3, phase="rollout_done")
    watcher = LivenessWatcher(cluster, ranks=[0, 1, 2], dead_after_s=30)
    result = wait_barrier(cluster, 3, "rollout_done", [0, 1, 2], watcher, on_tick=print)
    result.waited_s, result.arrivals[2].host

An arrival is `runs/<run_id>/barriers/iter_NNNN/<phase>/rank_<r>.json`, written
atomically (arriving twice just rewrites it). A waiter lists that directory
every `poll_s` seconds (the sleep only paces polling; nothing depends on it) and
returns once every rank has arrived. It waits through a long phase while the
others live, and stops at once when one is gone: RankFailed for a failure flag,
an eviction or a heartbeat silent for dead_after_s; RunStopped for stop.json or
a newer run; Evicted when this rank was evicted; RunFinished for a silent rank
once the master wrote finished.json (it ran the last step and exited).
BarrierTimeout only with an explicit timeout_s.

Several nodes wait in two tiers, so that a poll costs the filesystem O(ranks) on
the master and O(1) on each worker rather than O(ranks) on every node:

    master = wait_barrier(cluster0, 3, "rollout_done", [0, 1, 2], watcher)   # every arrival, every rank's life
    open_barrier(cluster0, master)                                           # `open.json`: the others go on
    worker = wait_open(cluster1, 3, "rollout_done", LivenessWatcher(cluster1, [0], 30))   # the master only

A worker learns of another worker's loss from the master: at a barrier from its
word (fail_barrier: `open.json` saying why it will not open), elsewhere from its
failure flag, both naming the rank (abort mode; continue mode drops the worker
and says so in `open.json`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from coordinator.cluster import Cluster, ClusterError, RankFailed, RunFinished, load_json, scan_ranks
from coordinator.heartbeat import FEW, LIVENESS_S, LivenessWatcher
from rollout_engine.defaults import BARRIER_REPORT_S
from rollout_engine.errors import ConfigError
from rollout_engine.files import save_json
from rollout_engine.layout import rank_file_name
from rollout_engine.shared_read import read_fresh

PHASE = re.compile(r"[a-z0-9][a-z0-9_-]*")
#: how often a waiter reads its own standing (stop, eviction, a newer run) and the others' failure flags,
#: evictions and heartbeats (s): heartbeats change every few seconds and a rank is dead after tens, so more often
#: only loads the filesystem; each poll in between reads only the arrivals (or the master's word)
LOOK_S = 1.0
#: Backoff: a wait's poll and look intervals grow with its age (a rollout's barrier can last an hour, and at 0.2 s
#: polls 1,000 nodes waiting an hour make about 90 million calls), up to caps that keep the latency goals:
#: a barrier opens within the master's poll plus a worker's, each at most POLL_CAP_S, plus the filesystem's
#: visibility (under 3 s); lookups by name (what a late listing lacks: sshfs) at most every NAMES_CAP_S
POLL_CAP_S = 1.0
LOOK_CAP_S = 5.0
NAMES_CAP_S = 2.0
#: the intervals stay at their base for the first STEADY_S of a wait (a short wait, a quick phase, polls as before),
#: then grow to their caps over GROWN_S
STEADY_S = 10.0
GROWN_S = 40.0
#: at most this many lookups by name a second of ranks a listing lacks (missing arrivals, failure flags,
#: evictions): the master's wait for 1,000 ranks would otherwise look up each of them every NAMES_CAP_S
NAMES_PER_S = 20.0
#: a worker's own standing (stop.json, run.json, its registration and eviction) at most this often in a long wait
#: (s): its heartbeat looks at each beat, and ends the node (the same exit) when the master's word says STOP
STANDING_CAP_S = 15.0
#: failure flags and evictions are looked up by name (beside the listing of their folders) at most this often
#: (s): a failed rank also stops beating, and its death is noticed within dead_after_s anyway
FLAG_NAMES_S = 30.0


class BarrierTimeout(ClusterError):
    """An explicit deadline passed before every rank arrived."""

    def __init__(self, iteration: int, phase: str, missing: list[int], timeout_s: float) -> None:
        self.missing = missing
        ranks = ", ".join(str(r) for r in missing)
        super().__init__(f"barrier {phase} of iteration {iteration}: ranks {ranks} missing after {timeout_s:g} s")


@dataclass(frozen=True)
class Arrival:
    """One rank's arrival at one barrier."""

    rank: int
    host: str
    pid: int
    run_id: str
    time: float = field(default_factory=time.time)  # the arriving host's wall clock
    #: what the arriving rank tells the others (the master's plan of a step, an update's outcome)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BarrierResult:
    iteration: int
    phase: str
    ranks: list[int]  # the ranks that arrived and were waited for
    arrivals: dict[int, Arrival]
    waited_s: float  # this waiter's monotonic clock
    gone: list[int] = field(default_factory=list)  # ranks dropped from the wait (--on-rank-failure continue)


@dataclass(frozen=True)
class BarrierWait:
    """What on_tick gets: who is still missing after how long."""

    iteration: int
    phase: str
    missing: list[int]
    waited_s: float


def grown(base: float, cap: float, waited_s: float) -> float:
    """An interval after `waited_s` of waiting: `base` for STEADY_S, then growing to `cap` (never below base)."""
    return max(base, min(cap, base + (cap - base) * max(0.0, waited_s - STEADY_S) / GROWN_S))


@dataclass
class Due:
    """Something a wait does every `interval` seconds of its clock (the first time at once)."""

    last: float | None = None

    def __call__(self, now: float, interval: float) -> bool:
        if self.last is not None and now - self.last < interval:
            return False
        self.last = now
        return True


def check_phase(phase: str) -> None:
    if not PHASE.fullmatch(phase):
        raise ConfigError(f"phase must be lower-case letters, digits, '_' or '-' (got {phase!r}); e.g. rollout_done")


def arrive(
    cluster: Cluster,
    iteration: int,
    phase: str,
    *,
    host: str | None = None,
    pid: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Record this node's (cluster.rank) arrival, with `data` for the waiters; arriving again rewrites it."""
    check_phase(phase)
    if cluster.rank is None or iteration < 0:
        raise ConfigError(f"arrive needs this node's rank and an iteration >= 0 (got {cluster.rank}, {iteration})")
    arrival = Arrival(
        cluster.rank, host or socket.gethostname(), os.getpid() if pid is None else pid, cluster.run_id, data=data or {}
    )
    save_json(cluster.barrier_dir(iteration, phase) / rank_file_name(cluster.rank, ".json"), asdict(arrival))


def arrivals(
    cluster: Cluster,
    iteration: int,
    phase: str,
    known: dict[int, Arrival] | None = None,
    want: Iterable[int] | None = None,
    by_name: bool = True,
) -> dict[int, Arrival]:
    """Who has arrived: one listing of the barrier directory, and (`by_name`) a lookup of each rank's file it
    lacks (of `want`, default every rank); the arrivals in `known` (read at an earlier poll of the same wait) are
    not read again."""
    found = dict(known or {})
    wanted = cluster.expected_ranks() if want is None else want
    expect = [rank for rank in wanted if rank not in found] if by_name else []
    for rank, path in scan_ranks(cluster.barrier_dir(iteration, phase), expect).items():
        if rank in found:
            continue
        data = load_json(path)
        if data is not None:
            found[rank] = Arrival(**data)
    return found


def check_ranks(
    cluster: Cluster, ranks: list[int], watcher: LivenessWatcher | None, by_name: bool = True, flags: bool = True
) -> None:
    """Raise RankFailed for the first of `ranks` that failed, was evicted (`flags`), or is dead by observation.
    Few ranks' flags are read by name; more ranks' by a listing of their folders and (`by_name`) a lookup of each."""
    if flags:
        check_flags(cluster, ranks, by_name)
    if watcher is not None:
        watcher.observe()
        dead = [rank for rank in watcher.dead() if rank in ranks]
        if dead:
            finished = cluster.finished()
            if finished is not None:  # the master exited after the last step: its silence is no death
                raise RunFinished(finished.reason)
            silent = watcher.silent_s(dead[0])
            raise RankFailed(dead[0], f"dead: no heartbeat change seen for {silent:.0f} s")


def check_flags(cluster: Cluster, ranks: list[int], by_name: bool) -> None:
    """Raise RankFailed for the first of `ranks` with a failure flag or an eviction."""
    few = len(ranks) < FEW
    failures = {r: f for r in ranks if (f := cluster.failure(r))} if few else cluster.failures(by_name)
    for rank in ranks:
        if rank in failures:
            failure = failures[rank]
            raise RankFailed(rank, f"failed in {failure.phase} of iteration {failure.iteration}: {failure.reason}")
    evictions = {r: e for r in ranks if (e := cluster.eviction(r))} if few else cluster.evictions(by_name)
    for rank in ranks:
        if rank in evictions and rank != cluster.rank:
            raise RankFailed(rank, f"evicted: {evictions[rank].reason}")


def wait_barrier(
    cluster: Cluster,
    iteration: int,
    phase: str,
    ranks: list[int],
    watcher: LivenessWatcher | None,
    *,
    timeout_s: float | None = None,
    poll_s: float = 0.2,
    on_tick: Callable[[BarrierWait], None] | None = None,
    tick_s: float = BARRIER_REPORT_S,
    clock: Callable[[], float] = time.monotonic,
    drop: Callable[[list[int]], list[int]] | None = None,
    fatal: list[int] | None = None,
    on_poll: Callable[[], None] | None = None,
) -> BarrierResult:
    """Return when every rank in `ranks` has arrived; raise as soon as waiting can no longer succeed.

    `on_tick` is called every `tick_s` seconds of waiting with who is missing. With `drop`
    (--on-rank-failure continue), the missing ranks it returns are out of the run: the wait goes on
    without them (BarrierResult.gone), and only the `fatal` ranks' loss fails it (default: all).
    `on_poll` runs before every sleep: the driver's watches (its heartbeat, its signals) tick during the wait,
    and whatever it raises ends the wait.
    """
    check_phase(phase)
    start = clock()
    next_tick = start + tick_s
    expected, gone = list(ranks), []
    arrived: dict[int, Arrival] = {}
    look, names, flag_names, alive = Due(), Due(), Due(), Due()
    while True:
        now = clock()
        age = now - start
        looking = look(now, grown(LOOK_S, LOOK_CAP_S, age))
        if looking:
            cluster.check_standing()
        missing = [rank for rank in expected if rank not in arrived]
        # the listing every poll; the lookups by name of the missing ranks every NAMES_CAP_S at most (on sshfs a
        # listing is 20 s late; each lookup is a round trip to the server), fewer a second when many are missing
        by_name = names(now, max(grown(LOOK_S, NAMES_CAP_S, age), len(missing) / NAMES_PER_S))
        arrived = arrivals(cluster, iteration, phase, arrived, expected, by_name=by_name)
        missing = [rank for rank in expected if rank not in arrived]
        if missing and drop is not None and looking:
            out = drop(missing)
            gone += out
            expected = [rank for rank in expected if rank not in out]
            missing = [rank for rank in missing if rank not in out]
        if not missing:
            return BarrierResult(iteration, phase, expected, arrived, clock() - start, gone)
        watched = [rank for rank in expected if fatal is None or rank in fatal]
        if looking:
            names_due = flag_names(now, max(FLAG_NAMES_S, 2 * len(watched) / NAMES_PER_S))
            check_ranks(cluster, watched, None, by_name=names_due)
        # the heartbeats on their own clock, at most LIVENESS_S apart whatever the looks' backoff: a beat seen to
        # change up to LIVENESS_S late, its silence judged at most LIVENESS_S late, within dead_after_s + 5 s
        if watcher is not None and alive(now, grown(LOOK_S, LIVENESS_S, age)):
            check_ranks(cluster, watched, watcher, flags=False)
        if timeout_s is not None and now - start >= timeout_s:
            raise BarrierTimeout(iteration, phase, missing, timeout_s)
        if on_tick is not None and now >= next_tick:
            on_tick(BarrierWait(iteration, phase, missing, now - start))
            next_tick = now + tick_s
        if on_poll is not None:
            on_poll()
        time.sleep(grown(poll_s, POLL_CAP_S, age))


def open_barrier(cluster: Cluster, result: BarrierResult) -> None:
    """The master's word that every rank it waited for arrived: the workers' wait_open returns `result`."""
    data = {"ranks": result.ranks, "gone": result.gone, "arrivals": {r: asdict(a) for r, a in result.arrivals.items()}}
    save_json(cluster.paths.barrier_open(result.iteration, result.phase), data)


def fail_barrier(cluster: Cluster, iteration: int, phase: str, reason: str) -> None:
    """The master's word that a barrier will not open (a rank it waited for is gone): the workers waiting at it
    stop at their next poll, before they would see the master's failure flag."""
    save_json(cluster.paths.barrier_open(iteration, phase), {"failed": reason})


def opened(cluster: Cluster, iteration: int, phase: str, listing: bool = True) -> BarrierResult | None:
    """The master's word at a barrier: its result (waited_s 0) once it opened; RankFailed(0) when it will not.
    Looked up by name, and (`listing`) where the name is not found, in a listing of its folder."""
    path = cluster.paths.barrier_open(iteration, phase)
    try:
        data = json.loads(read_fresh(path) if listing else path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:  # a stale handle on a replaced file: not now
        if exc.errno != errno.ESTALE:
            raise
        return None
    if "failed" in data:
        raise RankFailed(0, f"failed in {phase} of iteration {iteration}: {data['failed']}")
    arrived = {int(rank): Arrival(**arrival) for rank, arrival in data["arrivals"].items()}
    return BarrierResult(iteration, phase, list(data["ranks"]), arrived, 0.0, list(data["gone"]))


def wait_open(
    cluster: Cluster,
    iteration: int,
    phase: str,
    master: LivenessWatcher | None,
    *,
    timeout_s: float | None = None,
    poll_s: float = 0.2,
    on_tick: Callable[[BarrierWait], None] | None = None,
    tick_s: float = BARRIER_REPORT_S,
    clock: Callable[[], float] = time.monotonic,
    on_poll: Callable[[], None] | None = None,
) -> BarrierResult:
    """A worker's wait at a barrier of every rank (after its own arrival): until the master opens it
    (open_barrier), while the master lives. Each poll looks `open.json` up by name; every LOOK_S (growing with
    the wait's age: `grown`) a listing of its folder too, this rank's standing, the master's failure flag and its
    heartbeat (`master`: a watcher of rank 0)."""
    check_phase(phase)
    start = clock()
    next_tick = start + tick_s
    listing, standing = Due(), Due()
    while True:
        now = clock()
        age = now - start
        # this rank's standing, the master's failure flag and silence (finished.json: RunFinished): in a long wait
        # at most every STANDING_CAP_S, as this node's heartbeat looks at them each beat and ends the node (the
        # same exit) when the run ends for it
        looking = standing(now, grown(LOOK_S, STANDING_CAP_S, age))
        if looking:
            cluster.check_standing()
        # by name every poll, by listing too every NAMES_CAP_S at most (GlusterFS with NFS-like caches keeps a
        # name's absence for its negative timeout, 5 s): a poll is one lookup
        word = opened(cluster, iteration, phase, listing=listing(now, grown(LOOK_S, NAMES_CAP_S, age)))
        if word is not None:
            return dataclasses.replace(word, waited_s=clock() - start)
        if looking:
            check_ranks(cluster, [0], master)
        if timeout_s is not None and now - start >= timeout_s:
            raise BarrierTimeout(iteration, phase, [0], timeout_s)
        if on_tick is not None and now >= next_tick:
            on_tick(BarrierWait(iteration, phase, [0], now - start))
            next_tick = now + tick_s
        if on_poll is not None:
            on_poll()
        time.sleep(grown(poll_s, POLL_CAP_S, age))
