"""Benchmark: the filesystem load of real `run.sh` nodes on a GlusterFS brick, per phase, counted on the server
and on each node's client, beside bench/fs_load.py's simulated count at the same N.

    PYTHONPATH=. $BATON_APP_PY -m bench.fs_real                        # N = 2, 4, 8; starts its own vLLM
    PYTHONPATH=. $BATON_APP_PY -m bench.fs_real --nodes 2 --base-url http://127.0.0.1:8000/v1   # a running vLLM
    PYTHONPATH=. $BATON_APP_PY -m bench.fs_real --nodes 2,4,8 --tasks 48 --strace   # docs/benchmarks.md §4d

For each N, a GlusterFS volume is served here (bench/sharedfs.py, profile `gluster`: its clients' defaults) and
N `scripts/run.sh` nodes run on it as in the multi-node e2e tests (bench/nodes.py: each in PID, UTS and mount
namespaces of its own, through its own client), with default liveness (a beat every 5 s), the terminal view on
(`env_config.live_view=plain`), `--rl-phase rollout --rollout-split train-only --max-iterations 1 --debug-mode`
against ONE vLLM for all of them (small replies: `--max-new-tokens`). The last rank has weight 2 (the slow node):
once every other rank has finished its share and waits at the rollout's barrier, its rollout engine is held
(SIGSTOP of its recorded group) for `--hold` s and then let go, so the barrier lasts at least that long.

Every `--interval` s the harness reads the brick's operation counters (`gluster volume profile gv0 info
incremental`) and each node's client's own (its io-stats, dumped with `setfattr -n trusted.io-stats-dump` in the
node's mount namespace; the dump's own SETXATTR is subtracted from the server's count). Each interval is given
the phase the cluster was in throughout it, from what the nodes leave in the brick (read there, not through a
client): `start` (no rank's rollout engine is running yet, or some are: start-up, join, the start's filesystem
check), `rollout` (every rank's engine runs), `arrivals` (some ranks have finished their share, sealed it and
wait at the barrier, more than one still rolls out), `barrier` (every rank but the slow node waits: held, then
finishing its share), `update` (with `--both`: from the master's mark of the finished train rollout to its
mark of the update: the evaluation's 4 tasks, the dataset, one optimizer step trained across the nodes by torchrun,
the promotion), `end` (every engine done: the master merges, the nodes stop);
an interval that straddles two phases is left out of the per-phase figures. A per-second figure is the sum of
the phase's intervals' operations over their length. With `--strace`, `strace -f` of the processes run.sh started
on the master and on a waiting worker, during the hold, counts their own calls on the shared path (what
bench/fs_count.py counts: opens, which listings begin with, stats, renames, ...), beside the simulated ones. A node
that fails stops its run at once; the N is run again on a fresh volume (`--retries`) and the failure printed.
Prints markdown tables (stdout; progress on stderr) and the CPU model; `--json` writes the figures, `--keep` each
node's output and its client's last counter dump (the files and folders it opened and listed most).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import cpu_line
from bench.nodes import descendant, host_pgid, node_command
from bench.server import add_server_args, free_port, serve
from bench.sharedfs import SharedFs, shared_fs
from coordinator import groupfile
from rollout_engine.layout import Layout

REPO = Path(__file__).resolve().parents[1]
PHASES = ("start", "rollout", "arrivals", "barrier", "update", "end")
#: the metadata operations that make or move a name (Lustre's costly ones)
CHANGES = ("CREATE", "MKNOD", "RENAME", "MKDIR", "SYMLINK", "LINK")
#: a table row of `gluster volume profile ... info`: %-latency, avg, min, max (each "<n> ns"), calls, FOP
SERVER_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+ ns\s+[\d.]+ ns\s+[\d.]+ ns\s+(\d+)\s+([A-Z]+)\s*$")
#: a row of a client's io-stats dump: FOP, calls, avg, min, max latency
CLIENT_ROW = re.compile(r"^([A-Z]+)\s+(\d+)\s+[\d.]+ us")
#: the system calls strace counts on a node: what bench/fs_count.py counts as a call (an open, which a listing
#: begins with, a stat, rename, unlink, mkdir, fsync, fchmod, ftruncate, utime), not the bytes read or written
TRACED = (
    "openat,open,stat,lstat,newfstatat,statx,rename,renameat,renameat2,unlink,unlinkat,rmdir,mkdir,mkdirat,"
    "fsync,fdatasync,fchmod,ftruncate,utimensat"
)
#: a line of `strace -f -y` output: pid, then the call's name and its opening parenthesis
STRACE_LINE = re.compile(r"^\d+\s+([a-z0-9_]+)\(")

logger = logging.getLogger("bench.fs_real")


class NodeFailed(Exception):
    """A node exited with an error: the run cannot be measured (the others would wait for it)."""


@dataclass
class Interval:
    start: float
    end: float
    phase: str | None  # None: it straddles phases
    server: dict[str, int]
    clients: list[dict[str, int]]  # per rank: operations in the interval
    waiting: int = 0  # ranks done with their rollout, still running


@dataclass
class Node:
    rank: int
    proc: subprocess.Popen
    output: Path
    engine_seen: bool = False
    state: str = "start"  # start, rollout, barrier, exited
    cumulative: dict[str, int] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.fs_real", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,4,8", help="comma-separated node counts")
    parser.add_argument("--tasks", type=int, default=80, help="train tasks of the rollout per node (the data has 320)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between two reads of the counters")
    parser.add_argument("--hold", type=float, default=40.0, help="seconds the slow node's engine is held")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds a run may take before it is stopped")
    parser.add_argument("--retries", type=int, default=1, help="runs of an N again after a node failed")
    parser.add_argument(
        "--strace",
        action="store_true",
        help="strace -f the master and a waiting worker at the barrier (their own calls on the shared path)",
    )
    parser.add_argument("--no-sim", action="store_true", help="skip bench/fs_load.py's simulated count")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's node outputs under this folder")
    parser.add_argument(
        "--both",
        action="store_true",
        help="--rl-phase both: after the rollout, an update of one optimizer step across the nodes (phase `update`)",
    )
    add_server_args(parser)
    return parser.parse_args(argv)


def server_counts(text: str) -> dict[str, int]:
    """The brick's operations in the interval `text` reports (its `Interval N Stats`; not the cumulative ones)."""
    counts: dict[str, int] = {}
    interval = False
    for line in text.splitlines():
        if "Interval" in line and "Stats" in line:
            interval = True
        elif "Cumulative Stats" in line:
            interval = False
        elif interval and (m := SERVER_ROW.match(line)):
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1))
    return counts


def client_counts(text: str) -> dict[str, int]:
    """A client's operations since it mounted (the `Cumulative stats` table of its io-stats dump)."""
    counts: dict[str, int] = {}
    section = False
    for line in text.splitlines():
        if line.startswith("=== Cumulative stats"):
            section = True
        elif line.startswith("=== "):
            section = False
        elif section and line.startswith("------"):
            break
        elif section and (m := CLIENT_ROW.match(line)):
            counts[m.group(1)] = int(m.group(2))
    return counts


def dump_client(node: Node, mount: Path) -> dict[str, int] | None:
    """The node's client's counters since it mounted; None when the node has gone. Its whole dump (the files
    and folders it opened and listed most) is kept beside the node's output, the last one over the others."""
    name = f"baton-fsreal-{os.getpid()}-{node.rank}"
    out = Path("/run/gluster") / f"var-run-gluster-{name}.gv0"
    try:
        pid1 = descendant(node.proc, 1, timeout=1)
    except (RuntimeError, TimeoutError):
        return None
    cmd = ["nsenter", f"--target={pid1}", "--mount", "setfattr", "-n", "trusted.io-stats-dump"]
    done = subprocess.run([*cmd, "-v", f"/var/run/gluster/{name}", str(mount)], capture_output=True, check=False)
    if done.returncode != 0 or not out.exists():
        return None
    text = out.read_text(errors="replace")
    out.unlink()
    node.output.with_suffix(f".client.{node.state}.txt").write_text(text)
    return client_counts(text)


def node_pids(proc: subprocess.Popen) -> list[int]:
    """Every process run.sh started on the node (this machine's ids): not unshare, nor the node's pid 1, nor its
    filesystem client (tracing it would slow every call)."""
    pid1 = descendant(proc, 1)
    found, todo = [], [int(c) for c in Path(f"/proc/{pid1}/task/{pid1}/children").read_text().split()]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() != "glusterfs":
                found.append(pid)
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


class Trace:
    """`strace -f` on every process of one node for a while: its own calls on the shared path, counted."""

    def __init__(self, node: Node, mount: Path, out: Path) -> None:
        self.node, self.mount, self.out = node, mount, out
        pids = [arg for pid in node_pids(node.proc) for arg in ("-p", str(pid))]
        cmd = ["strace", "-f", "-y", "-qq", "-e", f"trace={TRACED}", "-o", str(out), *pids]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, start_new_session=True)
        self.since = time.monotonic()
        self.seconds: float | None = None

    def stop(self) -> None:
        if self.seconds is None:
            self.proc.send_signal(signal.SIGINT)  # it detaches from every process
            self.proc.wait(timeout=30)
            self.seconds = time.monotonic() - self.since

    def counts(self) -> dict[str, int]:
        """Calls on the shared path, by name (a stat of an open file, AT_EMPTY_PATH, is not a call)."""
        counts: dict[str, int] = {}
        for line in self.out.read_text(errors="replace").splitlines():
            m = STRACE_LINE.match(line)
            if m and str(self.mount) in line and "AT_EMPTY_PATH" not in line:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts


def start_nodes(n: int, args: argparse.Namespace, fs: SharedFs, url: str, outputs: Path) -> list[Node]:
    log = fs.path / "exp"
    weights = ",".join(["1"] * (n - 1) + ["2"])
    common = ["--data-path", str(args.data_path.resolve()), "--log-path", str(log), "--num-nodes", str(n)]
    common += ["--rank-weights", weights]
    if args.both:  # then a held-out rollout of 4 tasks and one optimizer step on every node's share
        common += ["--rl-phase", "both", "--eval-interval", "1", "env_config.test_tasks_rollout_size=4"]
        common += ["algorithm.max_steps=1", "algorithm.per_device_train_batch_size=1"]
        common += ["algorithm.gradient_accumulation_steps=1", "algorithm.learning_rate=1e-5"]
    else:
        common += ["--rl-phase", "rollout", "--rollout-split", "train-only"]
    common += ["--max-iterations", "1", "--debug-mode", f"policy_config.base_url={url}"]
    common += [f"policy_config.model={args.model}", f"policy_config.max_new_tokens={args.max_new_tokens}"]
    common += ["env_config.max_vllm_sessions=8", "env_config.live_view=plain"]
    common += [f"env_config.train_tasks_rollout_size={args.tasks * n}", "env_config.n_samples_per_task=1"]
    nodes = []
    for rank in range(n):
        role = ["--master"] if rank == 0 else ["--worker", str(rank)]
        cmd, extra = node_command(rank, REPO / "scripts/run.sh", [*common, *role], fs)
        env = {**os.environ, **extra, "BATON_VLLM_PORT": str(free_port())}
        output = outputs / f"node{rank}.log"
        with output.open("w") as out:  # the child holds its own copy (never a pipe)
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        nodes.append(Node(rank, proc, output))
    return nodes


def engine_pgid(seen: Path, rank: int) -> int | None:
    """The rank's train rollout engine's group (the node's own id) while it runs; None before and after."""
    record = groupfile.read(Layout(seen).groups(rank)).get("rollout-train")
    return None if record is None else record.pgid


def marked(seen: Path, phase: str) -> str | None:
    """What the master's marker of iteration 1's `phase` says (runstate.mark); None before it is there."""
    try:
        return (seen / "run" / "state" / "iter_0001" / f"{phase}.done").read_text().strip()
    except OSError:
        return None


def observe(nodes: list[Node], seen: Path, both: bool = False) -> str:
    """Each node's state from the brick, and the cluster's phase (`update` only in a run with --both)."""
    for node in nodes:
        if node.proc.poll() is not None:
            node.state = "exited"
        elif engine_pgid(seen, node.rank) is not None:
            node.engine_seen, node.state = True, "rollout"
        elif node.engine_seen:
            node.state = "barrier"
    states = {node.state for node in nodes}
    if "start" in states:
        return "start"
    if states == {"rollout"}:
        return "rollout"
    if "rollout" in states:
        waiting = sum(node.state == "barrier" for node in nodes)
        return "barrier" if waiting == len(nodes) - 1 else "arrivals"
    if both and marked(seen, "train_rollout") is not None and marked(seen, "update") is None:
        return "update"
    return "end"


class Holder:
    """Holds the slow node's engine once every other rank waits at the barrier, for `hold_s`, once."""

    def __init__(self, node: Node, seen: Path, hold_s: float) -> None:
        self.node, self.seen, self.hold_s = node, seen, hold_s
        self.pgid: int | None = None
        self.since: float | None = None
        self.done = False

    def tick(self, nodes: list[Node]) -> None:
        if self.done:
            return
        if self.pgid is None:
            others_wait = all(node.state == "barrier" for node in nodes if node is not self.node)
            if others_wait and self.node.state == "rollout":
                pgid = engine_pgid(self.seen, self.node.rank)
                host = host_pgid(self.node.proc, pgid) if pgid is not None else None
                if host is not None:
                    os.killpg(host, signal.SIGSTOP)
                    self.pgid, self.since = host, time.monotonic()
                    logger.info("held rank %d's engine (every other rank waits at the barrier)", self.node.rank)
            elif self.node.state != "rollout" and self.node.engine_seen:
                self.done = True  # the slow node finished first: no hold
        elif time.monotonic() - self.since >= self.hold_s:
            self.release()

    def release(self) -> None:
        if self.pgid is not None and not self.done:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGCONT)
            logger.info("let rank %d's engine go after %.0f s", self.node.rank, time.monotonic() - self.since)
        self.done = True


def run_once(n: int, args: argparse.Namespace, url: str, tmp: Path) -> tuple[list[Interval], dict]:
    """N nodes on a fresh volume: the intervals counted, and what else was seen."""
    outputs = (args.keep / f"n{n}") if args.keep else tmp / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    with shared_fs(tmp / "fs", "gluster") as fs:
        fs.gluster("volume", "profile", "gv0", "start")
        fs.gluster("volume", "profile", "gv0", "info", "incremental")  # the counters from now on
        seen = fs.store / "exp"
        nodes = start_nodes(n, args, fs, url, outputs)
        holder = Holder(nodes[-1], seen, args.hold)
        intervals: list[Interval] = []
        held_at: float | None = None
        began = last = time.monotonic()
        dumps = 0
        traces: list[Trace] = []
        try:
            while any(node.proc.poll() is None for node in nodes):
                if time.monotonic() - began > args.budget:
                    raise SystemExit(f"{n} nodes still ran after {args.budget:.0f} s; outputs in {outputs}")
                failed = [node for node in nodes if node.proc.poll() not in (None, 0)]
                if failed:
                    said = failed[0].output.read_text(errors="replace")
                    error = next((line for line in said.splitlines() if "error:" in line), "")
                    raise NodeFailed(
                        f"rank {failed[0].rank} exited {failed[0].proc.returncode}: {error}\n{said[-1500:]}"
                    )
                phases, waiting = set(), 0
                while time.monotonic() - last < args.interval:
                    phases.add(observe(nodes, seen, args.both))
                    waiting = max(waiting, sum(node.state == "barrier" for node in nodes))
                    holder.tick(nodes)
                    if holder.since is not None and held_at is None:
                        held_at = holder.since - began
                        # every rank but the held one waits: trace the master and a waiting worker
                        for rank in sorted({0, 1} - {n - 1}) if args.strace else []:
                            traces.append(Trace(nodes[rank], fs.path, outputs / f"node{rank}.strace"))
                    if traces and time.monotonic() - holder.since >= args.hold - 2:
                        for trace in traces:
                            trace.stop()
                    time.sleep(0.2)
                server = server_counts(fs.gluster("volume", "profile", "gv0", "info", "incremental"))
                if dumps:  # the previous interval's dumps reached the brick in this one
                    server["SETXATTR"] = max(0, server.get("SETXATTR", 0) - dumps)
                now = time.monotonic()
                clients, dumps = [], 0
                for node in nodes:
                    counts = dump_client(node, fs.path) if node.proc.poll() is None else None
                    dumps += counts is not None
                    if counts is None:
                        clients.append({})
                        continue
                    clients.append({k: v - node.cumulative.get(k, 0) for k, v in counts.items()})
                    node.cumulative = counts
                phase = phases.pop() if len(phases) == 1 else None
                intervals.append(Interval(last - began, now - began, phase, server, clients, waiting))
                last = now
        finally:
            for trace in traces:
                trace.stop()
            holder.release()
            for node in nodes:
                if node.proc.poll() is None:
                    with contextlib.suppress(OSError, RuntimeError, TimeoutError):
                        os.kill(descendant(node.proc, 1, timeout=5), signal.SIGKILL)  # the whole node at once
                    node.proc.wait(timeout=30)
        codes = [node.proc.returncode for node in nodes]
        if any(codes):
            tails = "\n".join(node.output.read_text(errors="replace")[-1500:] for node in nodes)
            raise SystemExit(f"{n} nodes: exit codes {codes}\n{tails}")
        episodes = sum(
            len(path.read_text().splitlines()) for path in seen.glob("trajectories/train/iter_0001/rank_*.jsonl")
        )
        update = marked(seen, "update")
    traced = {trace.node.rank: {"seconds": trace.seconds, "calls": trace.counts()} for trace in traces if trace.seconds}
    return intervals, {
        "held_at_s": held_at,
        "episodes": episodes,
        "took_s": time.monotonic() - began,
        "traced": traced,
        "update": update,
    }


def per_phase(n: int, intervals: list[Interval]) -> dict[str, dict]:
    """Per phase: seconds counted, the server's operations a second (all, creates+renames), the clients' (each
    rank's, all, creates+renames), the ranks waiting."""
    out = {}
    for phase in PHASES:
        chosen = [i for i in intervals if i.phase == phase]
        seconds = sum(i.end - i.start for i in chosen)
        if not chosen or seconds <= 0:
            continue
        server = sum(sum(i.server.values()) for i in chosen)
        server_changes = sum(i.server.get(op, 0) for i in chosen for op in CHANGES)
        ops: dict[str, int] = {}
        for i in chosen:
            for op, count in i.server.items():
                ops[op] = ops.get(op, 0) + count
        clients = [sum(sum(i.clients[r].values()) for i in chosen) / seconds for r in range(n)]
        client_changes = sum(i.clients[r].get(op, 0) for i in chosen for r in range(n) for op in CHANGES)
        out[phase] = {
            "seconds": seconds,
            "intervals": len(chosen),
            "server_ops_s": server / seconds,
            "server_ops_s_per_node": server / seconds / n,
            "server_changes_s": server_changes / seconds,
            "server_by_op_s": {op: count / seconds for op, count in sorted(ops.items(), key=lambda kv: -kv[1])},
            "client_ops_s": clients,
            "client_changes_s": client_changes / seconds,
            "waiting": max(i.waiting for i in chosen),
        }
    return out


def simulated(n: int, wait_s: float) -> dict:
    """bench/fs_load.py at N ranks (its own process: it replaces the clock), each phase `wait_s` simulated s."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "bench.fs_load", "--ranks", str(n), "--wait", f"{wait_s:g}", "--json", out.name]
        subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
        return json.loads(Path(out.name).read_text())[str(n)]


def report(results: dict[int, dict], args: argparse.Namespace) -> None:
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"cpu: {cpu_line()} (load {load}); a GlusterFS brick (client defaults), one vLLM for all nodes")
    print(
        f"{args.tasks} train tasks a node x 1 sample, max_new_tokens {args.max_new_tokens}, views on (plain),"
        " beats every 5 s;"
        f" the slow node held {args.hold:g} s at the barrier; counters read every {args.interval:g} s\n"
    )
    print(
        "| N | phase | s counted | server ops/s | per node | server creates+renames/s | client ops/s: master "
        "| a worker (mean) | clients' creates+renames/s | simulated client calls/s: master | a worker | cluster "
        "| simulated creates+renames/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, got in results.items():
        for phase, row in got["phases"].items():
            clients = row["client_ops_s"]
            workers = sum(clients[1:]) / max(1, n - 1)
            sim_phase = {"barrier": "barrier", "rollout": "rollout", "update": "training"}.get(phase, "")
            sim = got.get("simulated", {}).get(sim_phase, None)
            if sim:
                (mc, mx), (wc, wx) = sim["master"], sim["worker"]
                simulated_cells = f"{mc:.1f} | {wc:.2f} | {mc + (n - 1) * wc:.0f} | {mx + (n - 1) * wx:.1f}"
            else:
                simulated_cells = "- | - | - | -"
            print(
                f"| {n} | {phase} | {row['seconds']:.0f} | {row['server_ops_s']:.1f}"
                f" | {row['server_ops_s_per_node']:.1f}"
                f" | {row['server_changes_s']:.2f} | {clients[0]:.1f} | {workers:.1f} | {row['client_changes_s']:.2f}"
                f" | {simulated_cells} |"
            )
    print("\nThe server's operations per phase (per second, the largest first):")
    for n, got in results.items():
        for phase, row in got["phases"].items():
            ops = ", ".join(f"{op} {rate:.1f}" for op, rate in list(row["server_by_op_s"].items())[:8])
            print(f"- N={n}, {phase}: {ops}")
    for n, got in results.items():
        info = got["info"]
        held = "not held (it finished first)" if info["held_at_s"] is None else f"held at {info['held_at_s']:.0f} s"
        update = f"; the update: {info['update']}" if info.get("update") else ""
        print(f"- N={n}: {info['episodes']} episodes, {info['took_s']:.0f} s in all, the slow node {held}{update}")
        for failure in info.get("failed_runs", []):
            print(f"  - N={n}: a run before this one failed, run again: {failure.splitlines()[0]}")
    print("\nOne node's own calls on the shared path at the barrier (strace -f of its processes, the slow node held):")
    print("| N | rank | s traced | calls/s | renames+mkdirs/s | simulated calls/s | the calls/s, by name |")
    print("|---|---|---|---|---|---|---|")
    for n, got in results.items():
        for rank, trace in got["info"].get("traced", {}).items():
            calls, seconds = trace["calls"], trace["seconds"]
            total = sum(calls.values()) / seconds
            changes = sum(v for k, v in calls.items() if k.startswith(("rename", "mkdir"))) / seconds
            sim = got.get("simulated", {}).get("barrier")
            expected = f"{sim['master' if int(rank) == 0 else 'worker'][0]:.1f}" if sim else "-"
            names = ", ".join(f"{k} {v / seconds:.1f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))
            print(f"| {n} | {rank} | {seconds:.0f} | {total:.1f} | {changes:.2f} | {expected} | {names} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[fs_real] %(message)s", stream=sys.stderr)
    if os.geteuid() != 0:
        raise SystemExit("bench.fs_real serves GlusterFS and makes namespaces: run it as root")
    counts = [int(x) for x in args.nodes.split(",")]
    results: dict[int, dict] = {}
    with serve(args) as url:
        for n in counts:
            failures = []
            while True:
                with tempfile.TemporaryDirectory(prefix="baton-fsreal-") as tmp:
                    logger.info("%d nodes", n)
                    try:
                        intervals, info = run_once(n, args, url, Path(tmp))
                        break
                    except NodeFailed as failed:  # said, kept in the figures, and run again on a fresh volume
                        logger.warning("%d nodes: %s", n, failed)
                        failures.append(str(failed))
                        if len(failures) > args.retries:
                            raise SystemExit(f"{n} nodes failed {len(failures)} times; the last: {failed}") from None
            results[n] = {"phases": per_phase(n, intervals), "info": {**info, "failed_runs": failures}}
            results[n]["intervals"] = [vars(i) for i in intervals]
            if args.json:  # what is measured so far, should a later N fail
                args.json.write_text(json.dumps(results, indent=1))
    if not args.no_sim:
        for n in counts:
            logger.info("bench.fs_load --ranks %d --wait %g", n, args.hold)
            results[n]["simulated"] = simulated(n, args.hold)
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
