"""The multi-node protocol's subcommands of `python -m coordinator` (standard library only).

    python -m coordinator heartbeat --log-path L --run-id RUN --rank 1 &     # until SIGTERM
    python -m coordinator stop   --log-path L --reason "operator request"
    python -m coordinator status --log-path L

The driver (coordinator/driver/nodes.py) runs the rest of the protocol in-process
(coordinator.membership, .barrier, .cluster) and starts `heartbeat` as a process
group of its own: it beats while the driver is busy or stuck. `stop` and `status`
are for people; progress and errors go to stderr.
Exit codes (`rollout_engine.exits.Exit`; every command's: docs/cli.md#exit-codes):
0 done; 2 bad input (one message naming the field, the value and the fix); 3 a
rank failed or is dead (`rank R: reason`); 4 the run was stopped or
superseded (`stop --if-running`: the run is not running); 5 this rank was
evicted; 6 the run finished (the master ran the last step and exited: a silent
master is no death then); 1 a timeout or anything else.
`add_subcommands(subparsers)` lets another entry point carry these subcommands.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from coordinator.barrier import arrivals
from coordinator.cluster import (
    Cluster,
    ClusterError,
    Incarnation,
    RunFinished,
    RunNotRunning,
    RunRecord,
    StopRequest,
    load_run,
)
from coordinator.heartbeat import LivenessWatcher, PeerWatch, run_heartbeat
from coordinator.membership import not_running, pid_running, pid_started
from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.files import save_text
from rollout_engine.layout import Layout, iterations

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
#: rollout-only and update-only runs coordinate apart: a split deployment runs both on one log path
GROUPS = ("rollout", "update")
GROUP_HELP = "a rollout-only or update-only run: its files are under <log>/roles/<group>/cluster/"
Command = Callable[[argparse.Namespace], int]


def protocol_root(log_path: str, group: str | None) -> Path:
    """Where a run's protocol files live: <log>/cluster/ (both), <log>/roles/<group>/cluster/ (rollout, update)."""
    return Layout(log_path).role(group).root if group else Path(log_path)


def say(line: str) -> None:
    print(f"[baton] {line}", file=sys.stderr, flush=True)


def incarnation(spec: str) -> Incarnation:
    """`host:pid:started` (a registration's incarnation, as `members` prints it)."""
    host, pid, started = spec.rsplit(":", 2)
    return (host, int(pid), int(started))


def this_run(args: argparse.Namespace) -> tuple[Cluster, RunRecord]:
    """The run named by --run-id (default: the newest, from run.json) and its record."""
    run_id = args.run_id
    if run_id is None:
        newest = load_run(args.log_path)
        if newest is None:
            raise ConfigError(f"--log-path {args.log_path} has no cluster/run.json: no master has started there")
        run_id = newest.run_id
    cluster = Cluster(Path(args.log_path), run_id, rank=getattr(args, "rank", None))
    record = cluster.record()
    if record is None:
        raise ConfigError(f"--run-id {run_id} names no run on {args.log_path} ({cluster.run_dir} is missing)")
    return cluster, record


class SignalPacer:
    """Paces the heartbeat with a signal wait: SIGTERM/SIGINT end it at once.

    It also ends when the node's process (default: our parent) has exited: a heartbeat
    that outlived its node would keep a dead node looking alive.
    """

    def __init__(self, node_pid: int | None) -> None:
        self.parent = os.getppid()
        self.node_pid = self.parent if node_pid is None else node_pid
        self.node_gone = False
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def __call__(self, seconds: float) -> bool:
        if signal.sigtimedwait(STOP_SIGNALS, seconds) is not None:
            return True
        reparented = self.node_pid == self.parent and os.getppid() != self.parent
        self.node_gone = reparented or not pid_running(self.node_pid)
        return self.node_gone


def cmd_heartbeat(args: argparse.Namespace) -> int:
    cluster, record = this_run(args)
    pacer = SignalPacer(args.node_pid)
    cluster = replace(cluster, me=(socket.gethostname(), pacer.node_pid, pid_started(pacer.node_pid)))
    interval = args.interval or record.heartbeat_interval_s
    peers = None
    if args.stop_node:
        peers = PeerWatch(cluster, list(range(record.num_nodes)), record.dead_after_s, record.on_rank_failure)
        peers.on_evict = lambda rank: tell_node(pacer.node_pid, signal.SIGUSR1)  # it stops a training rank was in
    ended = run_heartbeat(cluster, args.rank, interval, pacer, host=socket.gethostname(), pid=os.getpid(), peers=peers)
    if ended is not None:
        if args.stop_node:
            stop_node(pacer.node_pid, ended, args.reason_file)
        raise ended
    if pacer.node_gone:
        say(f"heartbeat of rank {args.rank}: its node's process {pacer.node_pid} exited; stopping")
        return Exit.FAILED
    return 0


def stop_node(node_pid: int, ended: ClusterError, reason_file: str | None) -> None:
    """Tell the node why its part of the run ended (reason_file: `<exit code>\t<reason>`), then SIGTERM it."""
    if reason_file:
        save_text(Path(reason_file), f"{ended.exit_code}\t{ended}\n")
    say(f"stopping the node (pid {node_pid}): {ended}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(node_pid, signal.SIGTERM)


def tell_node(node_pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(node_pid, sig)


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the run to stop; with --if-running only a run that runs (exit 4 naming why it does not, asking nothing):
    run.sh --stop then stops a single-node run of the log path instead of an earlier multi-node run's record."""
    ask_stop(args.log_path, args.reason, os.getppid(), run_id=args.run_id, rank=args.rank, if_running=args.if_running)
    return 0


def ask_stop(
    log_path: str,
    reason: str,
    pid: int,
    *,
    run_id: str | None = None,
    rank: int | None = None,
    if_running: bool = False,
) -> None:
    """`stop` in-process: ask the run on `log_path` (a protocol root, as `protocol_root` gives it) to stop, as
    process `pid` (the driver: its own pid) of this host. Raises what `stop` turns into its exit code (`report`):
    RunNotRunning with `if_running` for a run that is not running, ConfigError where no run is recorded."""
    cluster, _ = this_run(argparse.Namespace(log_path=log_path, run_id=run_id, rank=rank))
    if if_running:
        why = not_running(log_path, on_wait=say)
        if why is not None:
            raise RunNotRunning(f"run {cluster.run_id} on {log_path} is not running ({why}): not asking it to stop")
    earlier = cluster.stop_request()
    if earlier is not None:  # the first request's reason is the one every node reports
        say(f"run {cluster.run_id} was already asked to stop: {earlier.reason}")
        return
    cluster.request_stop(StopRequest(reason, rank, socket.gethostname(), pid))
    say(f"asked run {cluster.run_id} to stop: {reason}")


def cmd_status(args: argparse.Namespace) -> int:
    cluster, record = this_run(args)
    ranks = list(range(record.num_nodes))
    window = args.window or min(2 * record.heartbeat_interval_s + 0.5, record.dead_after_s)
    watcher = LivenessWatcher(cluster, ranks, window)
    deadline = time.monotonic() + window
    # a beat changes once an interval: a look every half interval sees each change (each look reads every rank's
    # heartbeat; at 0.1 s a look, `status` on 1,000 nodes was 10,000 reads a second)
    every = max(0.1, min(window / 5, record.heartbeat_interval_s / 2))
    while time.monotonic() < deadline and not all(watcher.confirmed(rank) for rank in ranks):
        watcher.observe()
        time.sleep(every)
    master, weights_csv = record.master, ",".join(map(str, record.rank_weights))
    print(f"run {record.run_id}: master {master.host} {master.addr} (pid {master.pid}), {record.num_nodes} nodes")
    print(f"rank weights {weights_csv}; on rank failure: {record.on_rank_failure}")
    newer = cluster.superseded_by()
    if newer is not None:
        print(f"superseded: run.json names a newer run, {newer.run_id}")
    stop = cluster.stop_request()
    if stop is not None:
        print(f"stop requested: {stop.reason}")
    rows = [("rank", "host", "pid", "heartbeat", "state", "last barrier")]
    rows += status_rows(cluster, ranks, watcher, window)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def status_rows(cluster: Cluster, ranks: list[int], watcher: LivenessWatcher, window: float) -> list[tuple[str, ...]]:
    """One row per rank: registration, last heartbeat, state by observation over `window`, last barrier."""
    nodes, failures, evictions = cluster.nodes(), cluster.failures(), cluster.evictions()
    last = last_barriers(cluster)
    rows = []
    for rank in ranks:
        node, beat = nodes.get(rank), watcher.last_beat(rank)
        if rank in evictions:
            state = f"evicted: {evictions[rank].reason}"
        elif rank in failures:
            state = f"failed: {failures[rank].reason}"
        elif watcher.confirmed(rank):
            state = "alive"
        else:
            state = "no heartbeat" if beat is None else f"silent for {window:.1f} s"
        host, pid = (node.host, str(node.pid)) if node else ("-", "-")
        rows.append((str(rank), host, pid, f"seq {beat.seq}" if beat else "-", state, last.get(rank, "-")))
    return rows


def last_barriers(cluster: Cluster) -> dict[int, str]:
    """Each rank's latest arrival: the highest iteration, then the latest arrival time (that rank's own clock)."""
    latest: dict[int, tuple[int, float, str]] = {}
    ranks = set(cluster.expected_ranks())
    # the newest iteration first, and no older one once every rank has an arrival: the run's whole history of
    # barriers is N files per barrier
    for iteration, iter_dir in sorted(iterations(cluster.paths.barriers), reverse=True):
        if ranks and ranks <= set(latest):
            break
        found: dict[int, tuple[int, float, str]] = {}
        for phase_dir in iter_dir.iterdir():
            for rank, arrival in arrivals(cluster, iteration, phase_dir.name, want=(), by_name=False).items():
                if rank not in latest:
                    key = (iteration, arrival.time, f"{iter_dir.name} {phase_dir.name}")
                    found[rank] = max(found.get(rank, key), key)
        latest |= found
    return {rank: key[2] for rank, key in latest.items()}


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Add every protocol subcommand to another parser's subparsers."""
    beat = _run_parser(subparsers, "heartbeat", cmd_heartbeat, "beat until SIGTERM, stop.json or eviction")
    beat.add_argument("--interval", type=float, default=None, help="seconds (default: the run's)")
    beat.add_argument("--node-pid", type=int, default=None, help="beat while it runs (default: the parent)")
    beat.add_argument(
        "--stop-node",
        action="store_true",
        help="when the run ends for this rank (stop request, eviction, or, if the run aborts on a rank's "
        "failure, another rank failed or died): write why to --reason-file and SIGTERM the node",
    )
    beat.add_argument("--reason-file", default=None, help="with --stop-node: where to write '<exit code>\\t<why>'")
    stop = _run_parser(subparsers, "stop", cmd_stop, "ask the whole run to stop", rank_required=False)
    stop.add_argument("--reason", required=True)
    stop.add_argument("--if-running", action="store_true", help="only a run whose master beats (else exit 4)")
    status = subparsers.add_parser("status", help="ranks, liveness by observation, last barrier")
    status.add_argument("--log-path", required=True)
    status.add_argument("--group", choices=GROUPS, default=None, help=GROUP_HELP)
    status.add_argument("--run-id", default=None)
    status.add_argument("--window", type=float, default=None, help="seconds to watch heartbeats")
    status.set_defaults(func=cmd_status)


def _run_parser(
    subparsers: argparse._SubParsersAction, name: str, func: Command, help_text: str, rank_required: bool = True
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text)
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--group", choices=GROUPS, default=None, help=GROUP_HELP)
    parser.add_argument("--run-id", required=rank_required, default=None)
    parser.add_argument("--rank", type=int, required=rank_required, default=None)
    parser.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coordinator", description=__doc__.split("\n")[0])
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    return dispatch(parser.parse_args(argv))


def dispatch(args: argparse.Namespace) -> int:
    """Run a parsed subcommand; protocol errors become their exit codes (2 bad input, 3 rank failed, ...)."""
    if getattr(args, "group", None):
        args.log_path = str(protocol_root(args.log_path, args.group))
    try:
        return args.func(args)
    except (ConfigError, ClusterError) as exc:
        return report(exc)
    except KeyboardInterrupt:
        return Exit.SIGINT


def report(exc: ConfigError | ClusterError) -> int:
    """Say a subcommand's bad input or protocol outcome on stderr as the CLI does; return its exit code
    (2 bad input, 3 a rank failed, 4 not running, ...). An in-process caller reports the same way."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            say(f"error: {problem}")
        return Exit.BAD_INPUT
    say(f"{'' if isinstance(exc, (RunFinished, RunNotRunning)) else 'error: '}{exc}")
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
