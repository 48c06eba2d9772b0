"""Benchmark: the filesystem load of a multi-node run, per node and per phase, at 8, 128 and 1,000 ranks.

    PYTHONPATH=. $BATON_APP_PY -m bench.fs_load                         # N = 8, 128, 1000; 300 s waits
    PYTHONPATH=. $BATON_APP_PY -m bench.fs_load --ranks 8,64 --wait 60  # quicker
    cp bench/fs_load.py bench/fs_count.py /tmp/fs-before/bench/ && cd /tmp/fs-before && PYTHONPATH=. ...  # before

The project's own code runs here, one process of one node at a time, on a log path in a temp directory that
holds N registered ranks (registrations, heartbeats, status files), under a stepped clock
(bench/fs_count.py: a sleep advances it at once), with every filesystem call it makes counted. Meanwhile the
other ranks' world moves uncounted: every rank beats every 5 s (nobody dies), nobody arrives at the barrier
(the longest wait). Each node's processes, as run.sh starts them:
- rollout: the terminal view (`coordinator watch`), the heartbeat process (with its watch of the others),
  the rollout engine's status file;
- barrier: the same view and heartbeat, and the driver's wait (the master: every rank; a worker: the master's
  word);
- training: the update view, the heartbeat, the driver's watch of its training partners (every supervisor tick);
- join: one worker's whole join (calls in all, not per second), the master beating;
- stop: one node's heartbeat noticing stop.json (calls in all).
A per-second figure is the mean over a `--wait`-second phase (waits back off with their age). The cluster's
figure is the master's plus N - 1 workers'. Prints one markdown table (stdout) and the CPU model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.fs_count import Counter, Done, SteppedClock

CLOCK = SteppedClock()
CLOCK.install()  # before the project's imports: their `clock=time.monotonic` defaults bind to the stepped clock
COUNTER = Counter(Path("/nonexistent"))
COUNTER.install()

from bench.measure import cpu_line  # noqa: E402
from coordinator import barrier, heartbeat, watch  # noqa: E402
from coordinator.cluster import Cluster, Endpoint, NodeRecord, RankFailed, RunRecord, RunStopped, StopRequest  # noqa: E402
from rollout_engine.files import save_json  # noqa: E402
from rollout_engine.layout import Layout  # noqa: E402

RUN = "r" * 32
BEAT_S, DEAD_S, ITERATION = 5.0, 30.0, 3
TICK_S = 0.5  # the driver's supervisor ticks its watches every 0.5 s (coordinator/driver/supervise.py)


def incarnation(rank: int) -> tuple[str, int, int]:
    return (f"node{rank}", 10000 + rank, 1)


class World:
    """A log path with `n` ranks of one run, and their beats (uncounted)."""

    def __init__(self, root: Path, n: int, counter: Counter) -> None:
        self.root, self.n, self.counter = root, n, counter
        self.seq = 0
        self.next_beat = CLOCK.now
        self.last_beat: dict[int, float] = {}
        master = Endpoint("node0", "10.0.0.1", 10000)
        record = RunRecord(RUN, 0.0, n, [1] * n, master, 29600, 0, "abort", BEAT_S, DEAD_S)
        layout, cluster = Layout(root), Cluster(root, RUN)
        save_json(layout.run_record, asdict(record))
        save_json(cluster.paths.record, asdict(record))
        for rank in range(n):
            host, pid, started = incarnation(rank)
            cluster.register(NodeRecord(rank, host, f"10.0.0.{rank % 250 + 1}", pid, 8100, 0.0, started))
            save_json(layout.status(rank), self.status(rank))
        self.beat(CLOCK.now)
        CLOCK.hooks = [self.beat]

    def status(self, rank: int, done: bool = False) -> dict:
        return {
            "rank": rank,
            "split": "train",
            "iteration": ITERATION,
            "planned": 64,
            "resumed": 0,
            "finished": 64 if done else 10,
            "successes": 3,
            "running": 0 if done else 8,
            "failures": {},
            "completion_tokens": 1000,
            "elapsed_s": 30.0,
            "updated_at": float(CLOCK.now),
        }

    def beat(self, now: float, skip: int | None = None) -> None:
        """Every rank but the measured node beats every BEAT_S (its own beats are its heartbeat's, counted)."""
        if now < self.next_beat:
            return
        self.next_beat = now + BEAT_S
        self.seq += 1
        with self.counter.paused():
            folder = Cluster(self.root, RUN).heartbeat_dir
            folder.mkdir(parents=True, exist_ok=True)
            for rank in range(self.n):
                if rank == self.silent:
                    continue
                self.last_beat[rank] = now
                if rank != self.measured:  # in place: the world's beats need not be atomic, only cheap
                    line = heartbeat.Beat(self.seq, 0.0, *incarnation(rank)[:2]).line()
                    (folder / f"rank_{rank}").write_text(line)

    measured: int | None = None
    silent: int | None = None  # a rank that died: it beats no more


def window(seconds: float, run) -> float:  # type: ignore[no-untyped-def]
    """Run `run()` until the stepped clock passes `seconds` (or it returns); the simulated seconds it ran."""
    start = CLOCK.now
    CLOCK.end = start + seconds
    try:
        run()
    except Done:
        pass
    finally:
        CLOCK.end = None
    return CLOCK.now - start


def view(world: World, rank: int, phase: str, done: bool = False) -> None:
    """run.sh's terminal view on `rank`'s node (`python -m coordinator watch`), its loop as run_watch runs it;
    `done`: its own rollout finished (at the barrier after it), the others' not."""
    with world.counter.paused():
        save_json(Layout(world.root).status(rank), world.status(rank, done))
    if hasattr(watch, "view_loop"):
        watch.view_loop(watch.NodeView(world.root, phase, ITERATION, rank), lambda frame: None)
        return
    view_, stalls = watch.RunView(world.root), watch.StallWatch()
    while True:
        watch.build_frame(view_, stalls, phase, ITERATION)
        CLOCK.sleep(1.0)


def beats(world: World, rank: int) -> None:
    """The node's heartbeat process with its watch of the others (`coordinator heartbeat --stop-node`)."""
    cluster = Cluster(world.root, RUN, rank=rank, me=incarnation(rank))
    peers = heartbeat.PeerWatch(cluster, list(range(world.n)), DEAD_S, "abort")
    host, pid, _ = incarnation(rank)

    def wait(seconds: float) -> bool:
        CLOCK.sleep(seconds)
        return False

    ended = heartbeat.run_heartbeat(cluster, rank, BEAT_S, wait, host=host, pid=pid + 1, peers=peers)
    if ended is not None:
        raise ended


def status_writes(world: World, rank: int) -> None:
    """The rollout engine's status file, as often as its setting says (rollout_engine/live.py)."""
    from rollout_engine import live
    from rollout_engine.config import EnvConfig

    every = EnvConfig.__dataclass_fields__["status_interval_s"].default
    write = getattr(live, "write_status", None)
    while True:
        if write is not None:
            write(Layout(world.root).status(rank), world.status(rank))
        else:
            save_json(Layout(world.root).status(rank), world.status(rank))
        CLOCK.sleep(every)


def barrier_wait(world: World, rank: int) -> None:
    cluster = Cluster(world.root, RUN, rank=rank, me=incarnation(rank))
    barrier.arrive(cluster, ITERATION, "rollout_done", host=incarnation(rank)[0], pid=incarnation(rank)[1])
    every = 0.0  # as coordinator/driver/nodes.py watches: the wait paces its looks at the heartbeats
    ranks = list(range(world.n)) if rank == 0 else [0]
    watcher = heartbeat.LivenessWatcher(cluster, ranks, DEAD_S, every_s=every)
    if rank == 0:
        barrier.wait_barrier(cluster, ITERATION, "rollout_done", ranks, watcher)
    else:
        barrier.wait_open(cluster, ITERATION, "rollout_done", watcher)


def partners(world: World, rank: int) -> None:
    """The driver's watch of its training partners (coordinator/driver/nodes.py), every supervisor tick."""
    cluster = Cluster(world.root, RUN, rank=rank)
    from coordinator.driver import nodes

    look, known = getattr(nodes, "failed_partner", None), {}
    every = getattr(nodes, "PARTNERS_S", TICK_S)  # its watch does nothing at the ticks in between
    while True:
        if look is not None:
            look(cluster, ITERATION, rank, known)
        else:
            barrier.arrivals(cluster, ITERATION, "update")
        CLOCK.sleep(every)


def join(world: World, rank: int) -> None:
    from coordinator.membership import join_run

    host, pid, started = incarnation(rank)
    me = Endpoint(host, "10.0.0.9", pid)
    join_run(world.root, rank, world.n, [1] * world.n, 600, me=me, started=started, vllm_port=8100)


def stop(world: World, rank: int) -> None:
    try:
        beats(world, rank)
    except RunStopped:
        return


PHASES = {
    "rollout": [lambda w, r: view(w, r, "rollout-train"), beats, status_writes],
    "barrier": [lambda w, r: view(w, r, "rollout-train", done=True), beats, barrier_wait],
    "training": [lambda w, r: view(w, r, "update"), beats, partners],
}


def measure(n: int, wait_s: float) -> dict[str, dict[str, tuple[float, float]]]:
    """{phase: {"master"|"worker": (calls, creates+renames)}}: per second for the phases, in all for join/stop."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="baton-fsload-") as tmp:
        root = Path(tmp) / "log"
        counter = COUNTER
        counter.root = str(root)
        world = World(root, n, counter)
        for phase, parts in PHASES.items():
            out[phase] = {}
            for role, rank in (("master", 0), ("worker", n - 1)):
                calls = changes = 0.0
                for part in parts:
                    world.measured = rank if part is beats else None  # its own beats are its heartbeat's
                    with counter.counting():
                        took = window(wait_s, lambda part=part, rank=rank: part(world, rank))
                    c, cr, rn = counter.reset()
                    calls, changes = calls + c / took, changes + (cr + rn) / took
                out[phase][role] = (calls, changes)
        world.measured = None
        # join: a fresh registration of the last rank while the master beats
        Path(Cluster(root, RUN).paths.nodes_dir / f"rank_{n - 1}.json").unlink()
        with counter.counting():
            window(600, lambda: join(world, n - 1))
        c, cr, rn = counter.reset()
        out["join"] = {"worker": (c, cr + rn), "master": (0.0, 0.0)}
        # stop: stop.json appears; each node's heartbeat notices it at its next beat
        Cluster(root, RUN).request_stop(StopRequest("bench", None, "node0", 1))
        out["stop"] = {}
        for role, rank in (("master", 0), ("worker", n - 1)):
            world.measured = rank
            with counter.counting():
                window(60, lambda rank=rank: stop(world, rank))
            c, cr, rn = counter.reset()
            out["stop"][role] = (c, cr + rn)
        world.measured = None
        Path(Cluster(root, RUN).paths.stop).unlink()
        out["latency"] = latency(world, wait_s)  # type: ignore[assignment]
    return out


def latency(world: World, wait_s: float) -> tuple[float, float, float]:
    """After `wait_s` of waiting (the backoff at its caps): (seconds from the last arrival to the master's
    word, from the word to a worker's release, from a rank's last beat to the master's RankFailed)."""
    n, cluster = world.n, Cluster(world.root, RUN, rank=0)
    every = 0.0
    with world.counter.paused():
        for rank in range(n - 1):
            barrier.arrive(Cluster(world.root, RUN, rank=rank), 7, "late", host="h", pid=1)
    start, marks = CLOCK.now, {}

    # the worst case: each event just after the waiter's poll (marked at the end of one sleep, written at the end
    # of the next: the waiter sees it a whole poll interval later)
    def last_arrives(now: float) -> None:
        if "arrived" in marks and "written" not in marks:
            marks["written"] = now
            barrier.arrive(Cluster(world.root, RUN, rank=n - 1), 7, "late", host="h", pid=1)
        if now >= start + wait_s and "arrived" not in marks:
            marks["arrived"] = now

    CLOCK.hooks.append(last_arrives)
    ranks = list(range(n))
    result = barrier.wait_barrier(
        cluster, 7, "late", ranks, heartbeat.LivenessWatcher(cluster, ranks, DEAD_S, every_s=every)
    )
    CLOCK.hooks.remove(last_arrives)
    to_master, start = CLOCK.now - marks["arrived"], CLOCK.now

    def word(now: float) -> None:
        if "word" in marks and "said" not in marks:
            marks["said"] = now
            barrier.open_barrier(cluster, result)
        if now >= start + wait_s and "word" not in marks:
            marks["word"] = now

    CLOCK.hooks.append(word)
    worker = Cluster(world.root, RUN, rank=n - 1, me=incarnation(n - 1))
    barrier.wait_open(worker, 7, "late", heartbeat.LivenessWatcher(worker, [0], DEAD_S, every_s=every))
    CLOCK.hooks.remove(word)
    to_worker, start = CLOCK.now - marks["word"], CLOCK.now

    def dies(now: float) -> None:
        if now >= start + wait_s and world.silent is None:
            world.silent = n - 1

    CLOCK.hooks.append(dies)
    with contextlib.suppress(RankFailed):
        barrier.wait_barrier(
            cluster, 8, "never", ranks, heartbeat.LivenessWatcher(cluster, ranks, DEAD_S, every_s=every)
        )
    CLOCK.hooks.remove(dies)
    dead = CLOCK.now - world.last_beat[n - 1]
    world.silent = None
    return to_master, to_worker, dead


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,128,1000", help="comma-separated rank counts")
    parser.add_argument("--wait", type=float, default=300.0, help="simulated seconds each phase lasts")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    results = {}
    print("| N | phase | master calls/s | worker calls/s | cluster calls/s | 5N+50 | cluster creates+renames/s | N/5 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        got = measure(n, args.wait)
        results[n] = got
        for phase, roles in got.items():
            if phase == "latency":
                continue
            (mc, mx), (wc, wx) = roles["master"], roles["worker"]
            unit = "" if phase in ("rollout", "barrier", "training") else " (in all)"
            total, changes = mc + (n - 1) * wc, mx + (n - 1) * wx
            call_goal, change_goal = ("-", "-") if unit else (f"{5 * n + 50}", f"{n / 5:g}")
            print(
                f"| {n} | {phase}{unit} | {mc:.1f} | {wc:.2f} | {total:.0f} | {call_goal} | {changes:.1f} "
                f"| {change_goal} |",
                flush=True,
            )
    print("\n| N | last arrival -> master's word | word -> a worker released | barrier | last beat -> dead |")
    print("|---|---|---|---|---|")
    for n, got in results.items():
        master, worker, dead = got["latency"]
        print(f"| {n} | {master:.2f} s | {worker:.2f} s | {master + worker:.2f} s | {dead:.1f} s |")
    print(
        f"\nCPU: {cpu_line()}; each phase {args.wait:g} simulated s; dead after {DEAD_S:g} s, beats every {BEAT_S:g} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
