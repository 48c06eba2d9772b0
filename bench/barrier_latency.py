"""Benchmark: the multi-node protocol on one machine: barrier latency, and how soon a dead rank is noticed.

    PYTHONPATH=. $BATON_APP_PY -m bench.barrier_latency                          # 8 ranks, 20 barriers, dead after 30 s
    PYTHONPATH=. $BATON_APP_PY -m bench.barrier_latency --barriers 3 --dead-after 2   # a quick check
    PYTHONPATH=. $BATON_APP_PY -m bench.barrier_latency --log-path /mnt/nfs/bench     # on a shared filesystem
    PYTHONPATH=. $BATON_APP_PY -m bench.barrier_latency --profile gluster-5s --clients 8   # served here (as root)

`--ranks` simulated ranks run as separate processes, each with its own heartbeat
process (`python -m coordinator heartbeat`), on a log path in a temp
directory (or `--log-path`). Rank 0 starts the run, the others join it; then
every rank passes `--barriers` barriers in a row as the driver does (arrive; rank 0 waits for every rank and
opens the barrier, the others wait for its word: coordinator/barrier.py's two tiers; polling every `--poll` s).
Barrier latency is the time from the last arrival (the wall time it wrote) to each waiter's release, over every
waiter of every barrier. Then the last rank SIGKILLs its own heartbeat process while the others wait at one
more barrier: rank 0 finds it dead and says so at the barrier (fail_barrier, as the driver's master does), the
others stop at their next poll; the time from the kill to each waiter's RankFailed is how long the others take to
notice (about `--dead-after`, give or take one heartbeat interval and one look, LOOK_S). All processes share
this machine's clock, so wall times compare. Prints the CPU model beside the figures (stdout; progress on
stderr). On GlusterFS it also prints the load the waiting puts on the server: the brick's file operations per
second per rank (`gluster volume profile`), over 10 s in which every rank waits at the last barrier.

With `--profile` (bench/sharedfs.py: gluster, gluster-5s, sshfs), the log path is on a volume served on this
machine, and the ranks run in `--clients` "nodes" (PID, UTS and mount namespaces of their own, each mounting the
volume through its own client), rank r in node r % clients.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.measure import cpu_line
from bench.sharedfs import PROFILES, SharedFs, node_init, shared_fs
from coordinator.barrier import BarrierResult, arrivals, arrive, fail_barrier, open_barrier, wait_barrier, wait_open
from coordinator.cluster import Cluster, Endpoint, FailureRecord, RankFailed, StopRequest
from coordinator.heartbeat import LivenessWatcher
from coordinator.membership import join_run, start_run
from rollout_engine.files import save_json

REPO = Path(__file__).resolve().parents[1]
PHASE = "bench"
KILL_PHASE = "victim_silent"
NOTICED_PHASE = "noticed"
#: seconds of waiting over which the filesystem's load is counted
LOAD_S = 10.0


@dataclass(frozen=True)
class RankResult:
    rank: int
    latencies_s: list[float]  # per barrier: release - last arrival
    noticed_s: float | None  # kill -> RankFailed (None for the victim)
    error: str | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.barrier_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--barriers", type=int, default=20)
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between a waiter's looks")
    parser.add_argument("--dead-after", type=float, default=30.0, help="seconds without a heartbeat change: dead")
    parser.add_argument("--heartbeat-interval", type=float, default=None, help="seconds (default: dead-after / 6)")
    parser.add_argument("--log-path", type=Path, default=None, help="default: a new temp directory")
    parser.add_argument("--profile", choices=PROFILES, default="local", help="a shared filesystem served here")
    parser.add_argument("--clients", type=int, default=1, help="with --profile: nodes, each with its own client")
    parser.add_argument(
        "--load-after",
        type=float,
        default=0.0,
        help="seconds into the last wait before the load is counted (a long wait's backoff: 60 with --dead-after 120)",
    )
    parser.add_argument("--rank-process", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.heartbeat_interval = args.heartbeat_interval or args.dead_after / 6
    return args


def start_heartbeat(log: Path, run_id: str, rank: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "coordinator", "heartbeat", "--log-path", str(log)]
    return subprocess.Popen([*cmd, "--run-id", run_id, "--rank", str(rank)], cwd=REPO)


def rank_process(args: argparse.Namespace) -> None:
    """One simulated rank: start or join, beat, pass the barriers, then kill its beat (last rank) or notice it."""
    rank, log, n = args.rank_process, args.log_path, args.ranks
    me = Endpoint(socket.gethostname(), "127.0.0.1", os.getpid())
    timing = {"heartbeat_interval_s": args.heartbeat_interval, "dead_after_s": args.dead_after}
    if rank == 0:
        record = start_run(log, n, [1] * n, me=me, alive_window_s=0.1, **timing)
    else:
        record = join_run(log, rank, n, [1] * n, wait_s=120 + args.dead_after, me=me)
    beater = start_heartbeat(log, record.run_id, rank)
    cluster = Cluster(log, record.run_id, rank=rank)
    try:
        latencies = []
        for iteration in range(args.barriers + 1):  # iteration 0: everyone joined and beats
            arrive(cluster, iteration, PHASE)
            result = barrier(cluster, iteration, PHASE, args)
            released = time.time()
            if iteration > 0:
                latencies.append(released - max(a.time for a in result.arrivals.values()))
        noticed = silence(cluster, beater, args) if rank == n - 1 else notice(cluster, args)
        save_json(log / "bench" / f"rank_{rank}.json", asdict(RankResult(rank, latencies, noticed)))
    finally:
        if beater.poll() is None:
            beater.terminate()
        beater.wait()


def barrier(cluster: Cluster, iteration: int, phase: str, args: argparse.Namespace) -> BarrierResult:
    """The driver's wait at a barrier of every rank (coordinator/driver/nodes.py): rank 0 waits for them all and
    opens it, the others wait for its word while it lives."""
    if cluster.rank == 0:
        ranks = list(range(args.ranks))
        watcher = LivenessWatcher(cluster, ranks, args.dead_after)
        try:
            result = wait_barrier(cluster, iteration, phase, ranks, watcher, poll_s=args.poll)
        except RankFailed as failed:
            fail_barrier(cluster, iteration, phase, str(failed))
            raise
        open_barrier(cluster, result)
        return result
    return wait_open(cluster, iteration, phase, LivenessWatcher(cluster, [0], args.dead_after), poll_s=args.poll)


def silence(cluster: Cluster, beater: subprocess.Popen, args: argparse.Namespace) -> None:
    """The victim: once every other rank waits, SIGKILL our heartbeat and stay silent until the run stops."""
    others = args.ranks - 1
    while len(arrivals(cluster, args.barriers + 1, KILL_PHASE)) < others:
        time.sleep(args.poll)
    time.sleep(0.5)  # let each waiter start its watch
    beater.send_signal(signal.SIGKILL)
    save_json(cluster.run_dir / "killed.json", {"time": time.time()})
    while cluster.stop_request() is None:
        time.sleep(args.poll)


def notice(cluster: Cluster, args: argparse.Namespace) -> float:
    """An observer: wait at the last barrier until the victim is found dead; seconds from the kill."""
    iteration, victim = args.barriers + 1, args.ranks - 1
    arrive(cluster, iteration, KILL_PHASE)
    try:
        barrier(cluster, iteration, KILL_PHASE, args)
    except RankFailed as failed:
        noticed = time.time()
        if failed.rank == victim and cluster.rank == 0:  # the master's flag names it: the workers' way to know
            cluster.fail(FailureRecord(0, iteration, KILL_PHASE, str(failed), 1, socket.gethostname(), os.getpid()))
        elif f"rank {victim}: dead" not in failed.reason:
            raise
    else:
        raise RuntimeError("the barrier opened without the victim")
    killed = json.loads((cluster.run_dir / "killed.json").read_text())["time"]
    arrive(cluster, iteration, NOTICED_PHASE)
    if cluster.rank == 0:  # stop the run (and the victim) once every observer has noticed
        while len(arrivals(cluster, iteration, NOTICED_PHASE)) < victim:
            time.sleep(args.poll)
        cluster.request_stop(StopRequest("benchmark done", 0, socket.gethostname(), os.getpid()))
    return noticed - killed


def run_ranks(args: argparse.Namespace, log: Path, fs: SharedFs | None = None) -> list[RankResult]:
    """Start every rank process (each in its own process group; with `fs`, in its node's namespaces) and collect
    their results."""
    cmd = [sys.executable, "-m", "bench.barrier_latency", "--log-path", str(log), "--ranks", str(args.ranks)]
    cmd += ["--barriers", str(args.barriers), "--poll", str(args.poll), "--dead-after", str(args.dead_after)]
    cmd += ["--heartbeat-interval", str(args.heartbeat_interval)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if fs is None:
        procs = [
            subprocess.Popen([*cmd, "--rank-process", str(r)], cwd=REPO, env=env, start_new_session=True)
            for r in range(args.ranks)
        ]
    else:  # one process per node: its client, then its ranks; it exits when they have, with their worst code
        procs = []
        for node in range(args.clients):
            ranks = " ".join(str(r) for r in range(node, args.ranks, args.clients))
            script = (
                f"hostname node{node}\n{node_init(fs)}\nrc=0; pids=()\nfor r in {ranks}; do "
                f"{shlex.join(cmd)} --rank-process $r & pids+=($!); done\n"
                'for p in "${pids[@]}"; do wait "$p" || rc=1; done\nexit $rc\n'
            )
            unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "bash", "-c", script, f"node{node}"]
            procs.append(subprocess.Popen(unshare, cwd=REPO, env=env, start_new_session=True))
    load = None
    try:
        deadline = time.monotonic() + 180 + 2 * args.dead_after + args.barriers * 5
        if fs is not None and fs.profile.startswith("gluster"):
            load = waiting_load(fs, log, deadline, args.load_after)
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # only the groups this benchmark started
                proc.wait()
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        raise SystemExit(f"{'nodes' if fs else 'ranks'} {failed} failed; see their output above")
    results = [RankResult(**json.loads((log / "bench" / f"rank_{r}.json").read_text())) for r in range(args.ranks)]
    return results, load


def waiting_load(fs: SharedFs, log: Path, deadline: float, after_s: float = 0.0) -> float | None:
    """The brick's file operations per second while every rank waits at the last barrier (the victim's beat
    killed: LOAD_S of nothing but polling, from `after_s` into that wait), from GlusterFS's own counters; None if
    the wait ended first."""
    fs.gluster("volume", "profile", "gv0", "start")
    while not list(log.glob("cluster/runs/*/killed.json")):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    time.sleep(after_s)
    fs.gluster("volume", "profile", "gv0", "info", "incremental")  # the counters from now on
    started = time.monotonic()
    time.sleep(LOAD_S)
    text = fs.gluster("volume", "profile", "gv0", "info", "incremental")
    seconds = time.monotonic() - started
    calls = 0
    for line in text.splitlines():
        parts = line.split()  # %-latency, avg, min, max (each "<n> ns"), calls, FOP: the brick's interval stats
        if len(parts) >= 6 and parts[-2].isdigit() and parts[-1].isalpha() and parts[-1].isupper():
            calls += int(parts[-2])
    return calls / seconds


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rank_process is not None:
        rank_process(args)
        return
    with tempfile.TemporaryDirectory(prefix="baton-barrier-") as tmp, contextlib.ExitStack() as stack:
        fs = None if args.profile == "local" else stack.enter_context(shared_fs(Path(tmp), args.profile))
        log = args.log_path or (fs.path / "bench" if fs else Path(tmp))
        where = f"{args.profile}, {args.clients} clients" if fs else "the local disk"
        print(f"[bench] {args.ranks} rank processes on {log} ({where})", file=sys.stderr)
        results, load = run_ranks(args, log, fs)
    latencies = [s for result in results for s in result.latencies_s]
    noticed = [result.noticed_s for result in results if result.noticed_s is not None]
    print(f"cpu: {cpu_line()}; filesystem: {where}")
    print(
        f"ranks {args.ranks}, barriers {args.barriers}, poll {args.poll:g} s,"
        f" heartbeat every {args.heartbeat_interval:.3g} s, dead after {args.dead_after:g} s"
    )
    print(
        f"barrier latency (last arrival -> release, {len(latencies)} waits):"
        f" median {statistics.median(latencies):.3f} s, max {max(latencies):.3f} s"
    )
    print(
        f"dead rank noticed (SIGKILL of rank {args.ranks - 1}'s heartbeat -> RankFailed, {len(noticed)} observers):"
        f" median {statistics.median(noticed):.2f} s, max {max(noticed):.2f} s"
    )
    if load is not None:
        print(
            f"filesystem load while every rank waits (the brick's operations, {LOAD_S:g} s):"
            f" {load:.0f} per second, {load / args.ranks:.1f} per second per rank"
        )


if __name__ == "__main__":
    main()
