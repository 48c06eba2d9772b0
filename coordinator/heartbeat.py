"""Heartbeats: the beating process beside each node, and liveness judged on the observer's clock.

    python -m coordinator heartbeat --log-path L --run-id RUN --rank 1 --interval 5 &
    watcher = LivenessWatcher(cluster, ranks=[0, 1, 2], dead_after_s=30)
    watcher.observe()       # one listing of the heartbeat directory
    watcher.dead()          # [2] once rank 2's heartbeat has not changed for 30 s on this host's clock
    watcher.confirmed(0)    # True once rank 0's heartbeat was seen to change: it runs now

A heartbeat file `runs/<run_id>/heartbeat/rank_<r>` holds one line,
`seq wall_time host pid`, rewritten in place every interval; seq grows by
one per beat. Hosts' clocks differ, so nobody compares the wall time (or the
file's mtime) with their own clock: a rank is dead when the content has not
changed for `dead_after_s` on the observer's monotonic clock since the
observer first saw it or saw it change (or, if it never appeared, since the
observer started watching). Only a change seen between two reads proves life:
a file that merely appears may be an old one that NFS showed late.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout_engine.defaults import DEAD_AFTER_S
from rollout_engine.files import overwrite_text
from rollout_engine.layout import rank_file_name
from rollout_engine.shared_read import read_fresh

if TYPE_CHECKING:
    from coordinator.cluster import Cluster, ClusterError, Incarnation, NodeRecord


#: from this many ranks watched on, their failure flags and evictions are listed rather than looked up one by one
FEW = 4
#: the master's watch reads every registration again every this many beats (a rank's otherwise when the writer
#: of its heartbeat changed): a container restarted with the same host name and pids registers anew unseen
REGISTRATIONS_EVERY = 6
#: how often at most the master's barrier wait reads the heartbeats it watches (s), on its own clock beside the
#: wait's backoff: a beat seen to change at most LIVENESS_S late and judged dead at most LIVENESS_S late after
#: dead_after_s is noticed within dead_after_s + 5 s of the rank's last beat
LIVENESS_S = 2.5


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the file's whole content."""

    seq: int
    wall_time: float  # the beating host's clock: for people, never compared with another host's
    host: str
    pid: int
    #: the master's word to the workers, read with its beat: STOP when its run ended (stop.json, a newer run)
    word: str = ""

    def line(self) -> str:
        return f"{self.seq} {self.wall_time:.3f} {self.host} {self.pid}{f' {self.word}' if self.word else ''}\n"

    @classmethod
    def parse(cls, text: str) -> Beat | None:
        parts = text.split()
        try:
            return (
                cls(int(parts[0]), float(parts[1]), parts[2], int(parts[3]), *parts[4:])
                if len(parts) in (4, 5)
                else None
            )
        except ValueError:
            return None


#: the master's word when its run ended for every rank (coordinator.cluster.RunStopped): its workers look why
STOP = "stop"
#: ... and once its failure flag is written: its workers read it (else only every REGISTRATIONS_EVERY beats)
FAILED = "failed"


def write_beat(cluster: Cluster, rank: int, beat: Beat) -> None:
    """Rewrite the rank's heartbeat file in place, no fsync (rollout_engine.files.overwrite_text: no create or
    rename a beat; a beat must never wait for the disk's writeback of others' data; a beat lost in a crash is as
    stale as the one before it). A reader that catches it mid-write sees a line that differs (the writer is
    alive) or one that does not parse (skipped)."""
    overwrite_text(cluster.heartbeat_dir / rank_file_name(rank), beat.line())


def read_beats(cluster: Cluster, ranks: Iterable[int] | None = None) -> dict[int, Beat]:
    """The last beat of each of `ranks` (default: every rank, from one listing of the heartbeat directory; temp
    files skipped). With `ranks`, only their files are read: a worker watching the master reads one file."""
    if ranks is None:
        paths = cluster.heartbeat_files()
    else:
        paths = {rank: cluster.heartbeat_dir / rank_file_name(rank) for rank in ranks}
    beats = {}
    for rank, path in paths.items():
        try:
            beat = Beat.parse(read_fresh(path).decode("utf-8"))
        except FileNotFoundError:  # not written yet, or removed between the listing and the read
            continue
        except OSError as exc:  # still a stale handle on the file just replaced: this look sees no change
            if exc.errno != errno.ESTALE:
                raise
            continue
        if beat is not None:
            beats[rank] = beat
    return beats


@dataclass
class _Seen:
    beat: Beat | None
    since: float  # observer clock: when first seen, last seen to change, or (never seen) when watching began
    changes: int = 0


class LivenessWatcher:
    """Which of `ranks` are alive, by watching their heartbeats change on this observer's `clock`."""

    def __init__(
        self,
        cluster: Cluster,
        ranks: list[int],
        dead_after_s: float = DEAD_AFTER_S.default,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 0.0,
    ) -> None:
        self.cluster, self.dead_after_s, self.clock, self.every_s = cluster, dead_after_s, clock, every_s
        start = clock()
        self._seen = {rank: _Seen(None, start) for rank in ranks}
        self._looked: float | None = None

    def observe(self) -> None:
        """Read the watched ranks' heartbeats once and note what changed; within `every_s` of the last look,
        nothing (a waiter polling every 0.2 s need not read beats written every few seconds that often)."""
        now = self.clock()
        if self._looked is not None and now - self._looked < self.every_s:
            return
        self._looked = now
        beats = read_beats(self.cluster, list(self._seen))
        for rank, seen in self._seen.items():
            beat = beats.get(rank)
            if beat is None or beat == seen.beat:
                continue
            if seen.beat is not None:
                seen.changes += 1
            seen.beat, seen.since = beat, now

    def dead(self) -> list[int]:
        """Ranks whose heartbeat has not changed for dead_after_s (never seen: since watching began)."""
        now = self.clock()
        return [rank for rank, seen in self._seen.items() if now - seen.since >= self.dead_after_s]

    def confirmed(self, rank: int) -> bool:
        """The rank was seen beating (its heartbeat changed while we watched) and is not dead."""
        seen = self._seen[rank]
        return seen.changes > 0 and self.clock() - seen.since < self.dead_after_s

    def silent_s(self, rank: int) -> float:
        """Seconds on this clock since the rank's heartbeat was first seen, last changed, or watching began."""
        return self.clock() - self._seen[rank].since

    def last_beat(self, rank: int) -> Beat | None:
        return self._seen[rank].beat

    def changed_now(self, rank: int) -> bool:
        """The rank's heartbeat changed at the last look (the first sight of it is no change)."""
        seen = self._seen[rank]
        return seen.changes > 0 and seen.since == self._looked

    def changed(self, rank: int) -> bool:
        """The rank's heartbeat was seen to change at least once: it was alive while we watched."""
        return self._seen[rank].changes > 0

    def forget(self, rank: int) -> None:
        """Watch `rank` afresh from now (a new incarnation of it registered)."""
        self._seen[rank] = _Seen(None, self.clock())


def run_heartbeat(
    cluster: Cluster,
    rank: int,
    interval_s: float,
    wait: Callable[[float], bool],
    *,
    host: str,
    pid: int,
    peers: Callable[[], ClusterError | None] | None = None,
) -> ClusterError | None:
    """Beat every `interval_s` until `wait(interval_s)` returns True (None), or the run ends for this rank.

    The run ends for this rank when stop.json appears, the rank is evicted or a newer run
    superseded this one, or `peers()` returns a reason (another rank failed or died, when
    the run aborts on a rank's failure): then the reason is returned (RunStopped, Evicted,
    RankFailed). `wait` paces the loop: threading.Event().wait in a thread, a signal wait in the CLI.
    """
    last = read_beats(cluster, [rank]).get(rank)
    seq = last.seq if last is not None else 0
    while True:
        seq += 1
        if rank == 0:  # the master looks first, so that its beat carries its word (STOP, FAILED) to every worker
            ended = cluster.standing() or (peers() if peers is not None else None)
            write_beat(cluster, rank, Beat(seq, time.time(), host, pid, master_word(cluster, ended)))
        else:
            write_beat(cluster, rank, Beat(seq, time.time(), host, pid))
            ended = worker_look(cluster, peers, seq)
        if ended is not None:
            return ended
        if wait(interval_s):
            if rank == 0 and (word := master_word(cluster, None)):  # the node's way out wrote its failure flag
                write_beat(cluster, rank, Beat(seq + 1, time.time(), host, pid, word))
            return None


def master_word(cluster: Cluster, ended: ClusterError | None) -> str:
    """The master's word in its beat: STOP when its run ended for every rank; FAILED when another rank's loss
    ends the master (its way out writes its failure flag next) or once its own failure flag is written; else
    none. One lookup by name a beat, of the master's own file."""
    from coordinator.cluster import RankFailed, RunStopped

    if isinstance(ended, RunStopped):
        return STOP
    if isinstance(ended, RankFailed) or cluster.failure(0, listing=False) is not None:
        return FAILED
    return ""


def worker_look(cluster: Cluster, peers: PeerWatch | None, seq: int) -> ClusterError | None:
    """A worker's look at each beat: the master (its heartbeat, its failure flag: `peers`), and this rank's own
    standing (its registration, eviction, stop.json, run.json) only when it may have changed: in continue mode
    (a worker may be evicted), when the master's word says STOP, when the master's beat did not change since the
    last look (a master that is gone says nothing), and every REGISTRATIONS_EVERY beats. A worker so reads about
    three of the master's files a beat, not nine files; the master writes its word from what it reads anyway."""
    if peers is None or peers.mode == "continue":
        return cluster.standing() or (peers() if peers is not None else None)
    ended = peers()
    master = peers.watcher.last_beat(0)
    quiet = not peers.watcher.changed_now(0)
    if ended is not None or quiet or seq % REGISTRATIONS_EVERY == 0 or (master is not None and master.word == STOP):
        return cluster.standing() or ended
    return None


class PeerWatch:
    """The other ranks, watched beside each node (`mode`: the run's on_rank_failure).

    A worker watches only the master, the master every worker: each poll reads O(1) files on a worker and
    O(ranks) on the master, never O(ranks) on every node (docs/multinode.md "Scale").
    abort: a failure flag, an eviction, or a rank whose heartbeat has not changed for dead_after_s since
    this watch saw it register (or saw it beat) ends this node: one that died within a beat of joining too
    (a rank not registered yet may still be joining: the barriers judge that one); once the master has
    written finished.json (it ran the last step and exited), RunFinished instead. A master ended so writes
    its own failure flag naming the rank (coordinator/driver/nodes.py, `leave`): that is how the workers learn.
    continue: the master evicts a worker that failed or fell silent (its current registration: a restarted
    rank is a member again, judged from when it registered again) and goes on.
    """

    def __init__(self, cluster: Cluster, ranks: list[int], dead_after_s: float, mode: str = "abort") -> None:
        self.cluster, self.mode = cluster, mode
        self.ranks = [rank for rank in ranks if rank != cluster.rank]
        if cluster.rank != 0:
            self.ranks = [rank for rank in self.ranks if rank == 0]
        self.watcher = LivenessWatcher(cluster, self.ranks, dead_after_s)
        self.registered: dict[int, Incarnation] = {}
        self._nodes: dict[int, NodeRecord | None] = {}  # each rank's registration as last read
        self._writers: dict[int, tuple[str, int] | None] = {}  # ... and the heartbeat writer it was read for
        self._beats = -1
        #: called with the rank after each eviction (the heartbeat CLI signals its node: SIGUSR1)
        self.on_evict: Callable[[int], None] | None = None

    def __call__(self) -> ClusterError | None:
        from coordinator.cluster import RankFailed, RunFinished

        self.watcher.observe()
        self._beats += 1
        flags = None
        if len(self.ranks) >= FEW:  # the master: a listing of the flags' folders, not 2 lookups per rank
            flags = (self.cluster.failures(by_name=False), self.cluster.evictions(by_name=False))
        for rank in self.ranks:
            reason = self.gone(rank, flags)
            if reason is None:
                continue
            if self.mode == "continue" and self.cluster.rank == 0:
                self.evict(rank, reason)
                continue
            finished = self.cluster.finished()
            if finished is not None:  # the master exited after the last step: its silence is no death
                return RunFinished(finished.reason)
            return RankFailed(rank, reason)
        return None

    def gone(self, rank: int, flags: tuple[dict, dict] | None = None) -> str | None:
        """Why `rank` is out of the run, if it is: its failure flag, its eviction, or its silence. With `flags`
        (every rank's failure flags and evictions, listed once a beat) they are not looked up one by one. Its
        registration is read again only when its heartbeat's writer changed (a restarted node beats from another
        process) and every REGISTRATIONS_EVERY beats: a beat reads about one file a rank on the master, a few of
        the master's on a worker."""
        beat = self.watcher.last_beat(rank)
        writer = None if beat is None else (beat.host, beat.pid)
        again = self._beats % REGISTRATIONS_EVERY == 0  # a restart from a process with the same host and pid
        if again or rank not in self.registered or self._writers.get(rank) != writer:
            self._nodes[rank] = self.cluster.node(rank)
            self._writers[rank] = writer
        node = self._nodes[rank]
        if node is not None and self.registered.get(rank) != node.incarnation:
            # first seen registered, or registered again (restarted): judge its heartbeat from now on this clock
            self.watcher.forget(rank)
            self.registered[rank] = node.incarnation
        continuing = self.mode == "continue"
        if flags is not None:
            failure = flags[0].get(rank)
        elif rank == 0 and self.cluster.rank != 0 and not again and (beat is None or beat.word != FAILED):
            failure = None  # a worker reads the master's flag when the master's word says so (master_word)
        else:  # by name, and a listing too (a name's absence may be cached) every REGISTRATIONS_EVERY beats
            failure = self.cluster.failure(rank, listing=again)
        if failure is not None and (not continuing or node is None or failure.incarnation == node.incarnation):
            return f"failed in {failure.phase} of iteration {failure.iteration}: {failure.reason}"
        if rank == 0:  # only the master evicts
            eviction = None
        elif flags is None:
            eviction = self.cluster.evicted(rank, node)
        else:
            eviction = flags[1].get(rank)
            eviction = eviction if eviction is not None and eviction.applies_to(node) else None
        if eviction is not None:
            return None if continuing else f"evicted: {eviction.reason}"
        if rank in self.watcher.dead() and (node is not None or self.watcher.changed(rank)):
            return f"dead: no heartbeat change seen for {self.watcher.silent_s(rank):.0f} s"
        if continuing and rank in self.watcher.dead() and node is None:  # abort mode leaves this to the barriers
            return f"never joined: no registration or heartbeat in {self.watcher.silent_s(rank):.0f} s"
        return None

    def drop(self, missing: list[int], planned: dict[int, Incarnation] | None = None) -> list[int]:
        """Of the ranks a barrier misses, those out of the run (continue mode): evicted ones (with `planned`,
        rank -> the incarnation the step was planned with), and on the master the ones it evicts now (failed,
        or silent)."""
        from coordinator.cluster import planned_node

        out = []
        self.watcher.observe()
        for rank in missing:
            if rank == self.cluster.rank or (rank == 0 and self.cluster.rank != 0):
                continue
            if self.cluster.rank == 0 and rank in self.ranks and (reason := self.gone(rank)) is not None:
                self.evict(rank, reason)
            node = None
            if planned is not None and rank in planned:
                node = planned_node(rank, planned[rank])
            if self.cluster.evicted(rank, node) is not None:
                out.append(rank)
        return out

    def evict(self, rank: int, reason: str) -> None:
        """The master's verdict on `rank`'s current registration (once)."""
        from coordinator.cluster import Eviction

        node = self.cluster.node(rank)
        if self.cluster.evicted(rank, node) is not None:
            return
        host, pid, started = node.incarnation if node is not None else ("", 0, 0)
        verdict = Eviction(rank, reason, 0, socket.gethostname(), os.getpid(), node_host=host, node_pid=pid)
        self.cluster.evict(dataclasses.replace(verdict, node_started=started))
        print(f"[baton] rank {rank} evicted: {reason}; the run goes on without it", file=sys.stderr, flush=True)
        if self.on_evict is not None:
            self.on_evict(rank)
