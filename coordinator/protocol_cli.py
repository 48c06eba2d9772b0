"""The multi-node protocol from bash: run.sh calls these subcommands (standard library only).

    RUN=$(python -m coordinator start-run --log-path L --num-nodes 3 --rank-weights 1,1,1 --pid $$)
    RUN=$(python -m coordinator join --log-path L --rank 1 --num-nodes 3 --rank-weights 1,1,1 --pid $$)
    python -m coordinator heartbeat --log-path L --run-id "$RUN" --rank 1 &     # until SIGTERM
    python -m coordinator arrive --log-path L --run-id "$RUN" --rank 1 --iteration 3 --phase rollout_done
    python -m coordinator wait   --log-path L --run-id "$RUN" --rank 1 --iteration 3 --phase rollout_done
    python -m coordinator fail   --log-path L --run-id "$RUN" --rank 1 --iteration 3 --phase rollout \
        --reason "rollout exited 1" --exit-code 1
    python -m coordinator stop   --log-path L --reason "operator request"
    python -m coordinator finish --log-path L --run-id "$RUN" --reason "the master ran the last step"
    python -m coordinator partner-failed --log-path L --run-id "$RUN" --rank 1 --iteration 3 --phase update \
        --key train_exit &        # while this node trains: exits 0 once another node's part failed
    python -m coordinator evict  --log-path L --run-id "$RUN" --rank 2 --reason "no heartbeat for 30 s"
    python -m coordinator status --log-path L

start-run and join print the run id on stdout; progress and errors go to stderr.
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
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from coordinator.barrier import BarrierWait, arrivals, arrive, check_phase, wait_barrier
from coordinator.cluster import (
    ON_RANK_FAILURE,
    Cluster,
    ClusterError,
    Endpoint,
    Eviction,
    FailureRecord,
    FinishRecord,
    Incarnation,
    RunFinished,
    RunNotRunning,
    RunRecord,
    RunStopped,
    StopRequest,
    load_run,
)
from coordinator.heartbeat import LivenessWatcher, PeerWatch, run_heartbeat
from coordinator.membership import default_addr, join_run, not_running, pid_running, pid_started, start_run
from rollout_engine.defaults import BARRIER_REPORT_S, DEAD_AFTER_S, HEARTBEAT_S, JOIN_WAIT_S
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


def planned_nodes(text: str) -> dict[int, Incarnation]:
    """`1=host:pid:started,2=host:pid:started`: the registrations a step was planned with (`members`' m_<r>)."""
    try:
        pairs = [item.split("=", 1) for item in text.split(",") if item]
        return {int(rank): incarnation(spec) for rank, spec in pairs}
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"must be rank=host:pid:started,... e.g. 1=node1:4242:81234 (got {text!r})"
        ) from None


def incarnation(spec: str) -> Incarnation:
    """`host:pid:started` (a registration's incarnation, as `members` prints it)."""
    host, pid, started = spec.rsplit(":", 2)
    return (host, int(pid), int(started))


def int_list(text: str) -> list[int]:
    try:
        return [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, e.g. 1,1 (got {text!r})") from None


def me(args: argparse.Namespace) -> Endpoint:
    """This node as the caller describes it.

    The pid is given, not guessed: bash may run `$(python ...)` from a short-lived subshell.
    """
    return Endpoint(args.host or socket.gethostname(), args.addr or default_addr(), args.pid)


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


def cmd_start_run(args: argparse.Namespace) -> int:
    record = start_run(
        args.log_path,
        args.num_nodes,
        args.rank_weights,
        me=me(args),
        vllm_port=args.vllm_port,
        torchrun_port=args.torchrun_port,
        start_iteration=args.start_iteration,
        on_rank_failure=args.on_rank_failure,
        heartbeat_interval_s=args.heartbeat_interval,
        dead_after_s=args.dead_after,
        alive_window_s=args.alive_window,
        poll_s=args.poll,
        on_wait=say,
    )
    print(record.run_id)
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    record = join_run(
        args.log_path,
        args.rank,
        args.num_nodes,
        args.rank_weights,
        args.wait,
        me=me(args),
        vllm_port=args.vllm_port,
        poll_s=args.poll,
        on_wait=lambda line: say(f"rank {args.rank}: {line}"),
    )
    print(record.run_id)
    return 0


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


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object, e.g. {{"iteration": 3}} (got {text!r})')
    return value


def cmd_arrive(args: argparse.Namespace) -> int:
    cluster, _ = this_run(args)
    arrive(cluster, args.iteration, args.phase, pid=args.pid, data=args.data)
    return 0


def print_data(data: dict) -> None:
    """One `key<TAB>value` line per item, for bash: booleans as 1/0, strings and numbers as they are."""
    for key, value in data.items():
        if isinstance(value, bool):
            value = int(value)
        elif value is None:
            value = ""
        elif not isinstance(value, (str, int, float)):
            value = json.dumps(value)
        print(f"{key}\t{value}")


def cmd_wait(args: argparse.Namespace) -> int:
    cluster, record = this_run(args)
    ranks = args.ranks if args.ranks is not None else list(range(record.num_nodes))
    bad = [rank for rank in ranks if not 0 <= rank < record.num_nodes]
    if bad:
        raise ConfigError(f"--ranks must be in 0..{record.num_nodes - 1} for this run (got {bad})")
    if record.on_rank_failure == "continue" and args.planned is not None:
        # A step waits for the ranks it was planned with: a worker that (re)joined since skips this step and
        # is planned into the next, so waiting for it here would never end (issue 24, bug 1).
        ranks = [rank for rank in ranks if rank in (0, args.rank) or rank in args.planned]
    watcher = LivenessWatcher(cluster, ranks, args.dead_after or record.dead_after_s)

    def tick(progress: BarrierWait) -> None:
        missing = ", ".join(str(rank) for rank in progress.missing)
        waited = f"{progress.waited_s:.0f} s"
        say(f"rank {args.rank}: {args.phase} of iteration {args.iteration}: waiting for ranks {missing} ({waited})")

    timing = {"timeout_s": args.timeout, "poll_s": args.poll, "tick_s": args.report_every}
    membership = {}
    if record.on_rank_failure == "continue":  # a lost worker is dropped; only the master's loss ends the wait
        peers = PeerWatch(cluster, list(range(record.num_nodes)), args.dead_after or record.dead_after_s, "continue")
        membership = {"drop": lambda missing: peers.drop(missing, args.planned), "fatal": [0]}
    result = wait_barrier(cluster, args.iteration, args.phase, ranks, watcher, on_tick=tick, **timing, **membership)
    if result.gone:
        evictions = cluster.evictions()
        why = "; ".join(f"rank {r} evicted: {evictions[r].reason}" for r in result.gone if r in evictions)
        where = f"rank {args.rank}: {args.phase} of iteration {args.iteration}"
        say(f"{where}: going on without ranks {result.gone} ({why})")
    if args.print_data:
        merged: dict = {}
        for rank in result.ranks:
            merged |= result.arrivals[rank].data
        if result.gone:
            merged["gone"] = ",".join(str(rank) for rank in result.gone)
        print_data(merged)
    return 0


def cmd_partner_failed(args: argparse.Namespace) -> int:
    """While this node runs its part of a training: exit 0, printing `<rank>\t<value>`, as soon as another
    node arrived at the phase's barrier with a failed part (`data[key]` not 0). Its torchrun is gone, and this
    node's part would wait for it until launch.timeout_s. Exit 1 when this process's parent (the node) is gone;
    otherwise it runs until SIGTERM."""
    cluster, record = this_run(args)
    ranks = args.ranks if args.ranks is not None else [r for r in range(record.num_nodes) if r != args.rank]
    check_phase(args.phase)
    parent = os.getppid()
    while os.getppid() == parent:
        for rank, arrival in sorted(arrivals(cluster, args.iteration, args.phase).items()):
            value = arrival.data.get(args.key)
            if rank in ranks and value not in (None, 0, "0", ""):
                print(f"{rank}\t{value}")
                return 0
        time.sleep(args.poll)
    return Exit.FAILED


def cmd_fail(args: argparse.Namespace) -> int:
    cluster, _ = this_run(args)
    check_phase(args.phase)
    pid = args.pid or os.getppid()
    host, started = socket.gethostname(), pid_started(pid)
    failure = FailureRecord(args.rank, args.iteration, args.phase, args.reason, args.exit_code, host, pid)
    cluster.fail(replace(failure, started=started))
    return 0


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


def cmd_finish(args: argparse.Namespace) -> int:
    """The master, on its way out of a run that ended well: the nodes still running (a rank that rejoined and
    waits for a step, one still reloading its vLLM) learn that no step is left, not that the master died."""
    cluster, _ = this_run(args)
    cluster.finish(FinishRecord(args.reason, socket.gethostname(), os.getppid()))
    return 0


def cmd_fence(args: argparse.Namespace) -> int:
    """Exit 0 while --run-id is the log path's run; 4 once a newer master's start superseded it. The master asks
    before it writes the run's state (run/state): a node of an older run writes nothing more there (the
    processes it starts are fenced by rollout_engine.fence)."""
    cluster, _ = this_run(args)
    newer = cluster.superseded_by()
    if newer is not None:
        raise RunStopped(f"run {cluster.run_id} was superseded by run {newer.run_id} (master {newer.master.host})")
    return 0


def cmd_members(args: argparse.Namespace) -> int:
    """The master's view of who is in the next step, as key<TAB>value lines for its plan: `members` (csv),
    `weights` (the run's, 0 for a rank that is out) and `m_<r>` (host:pid:started of each member's registration).
    Continue mode: the ranks registered and not evicted (`--wait-all S`: first wait up to S s, while they
    join, for every rank to register); abort mode: every rank."""
    cluster, record = this_run(args)
    ranks = list(range(record.num_nodes))
    members = ranks
    if record.on_rank_failure == "continue":
        deadline = time.monotonic() + (args.wait_all or 0)
        while len(cluster.nodes()) < record.num_nodes and time.monotonic() < deadline:
            time.sleep(args.poll)
        members = cluster.members(record.num_nodes, args.planned)
    nodes = cluster.nodes()
    data: dict = {"members": ",".join(map(str, members))}
    data["weights"] = ",".join(
        str(w if rank in members else 0) for rank, w in zip(ranks, record.rank_weights, strict=True)
    )
    data |= {f"m_{rank}": ":".join(map(str, nodes[rank].incarnation)) for rank in members if rank in nodes}
    print_data(data)
    return 0


def cmd_evict(args: argparse.Namespace) -> int:
    cluster, _ = this_run(args)
    cluster.evict(Eviction(args.rank, args.reason, args.by_rank, socket.gethostname(), os.getppid()))
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    """The run record as key<TAB>value lines (master_host, master_addr, torchrun_port, ...), for bash."""
    _, record = this_run(args)
    data = {k: v for k, v in asdict(record).items() if k != "master"}
    data |= {"master_host": record.master.host, "master_addr": record.master.addr, "master_pid": record.master.pid}
    data["rank_weights"] = ",".join(map(str, record.rank_weights))
    print_data(data)
    return 0


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


PLANNED_HELP = (
    "continue runs: rank=host:pid:started,... the registrations the step was planned with (of them, the evicted; "
    "'' for none: wait skips the workers the step was planned without)"
)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Add every protocol subcommand to another parser's subparsers."""
    start = subparsers.add_parser("start-run", help="node 0: start a run (prints its id)")
    _add_node_args(start)
    start.add_argument("--torchrun-port", type=int, default=None)
    start.add_argument("--start-iteration", type=int, default=0)
    start.add_argument("--on-rank-failure", choices=ON_RANK_FAILURE, default="abort")
    start.add_argument("--heartbeat-interval", type=float, default=HEARTBEAT_S.default, help="seconds between beats")
    start.add_argument(
        "--dead-after", type=float, default=DEAD_AFTER_S.default, help="seconds without a beat change: dead"
    )
    start.add_argument("--alive-window", type=float, default=None, help="seconds to watch an earlier master")
    start.set_defaults(func=cmd_start_run)
    join = subparsers.add_parser("join", help="a worker: wait for the live master's run and join it")
    join.add_argument("--rank", type=int, required=True)
    _add_node_args(join)
    join.add_argument("--wait", type=float, default=JOIN_WAIT_S.default, help="seconds to wait for a live master")
    join.set_defaults(func=cmd_join)
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
    arrive = _barrier_parser(subparsers, "arrive", cmd_arrive, "record this rank's arrival at a barrier")
    arrive.add_argument("--data", type=json_object, default=None, help="a JSON object the waiters can print")
    arrive.add_argument("--pid", type=int, default=None, help="the node's process (default: this one)")
    wait = _barrier_parser(subparsers, "wait", cmd_wait, "wait until every rank arrived, while they live")
    wait.add_argument("--ranks", type=int_list, default=None, help="comma-separated (default: every rank)")
    wait.add_argument("--timeout", type=float, default=None, help="seconds (default: none)")
    wait.add_argument("--poll", type=float, default=0.2)
    wait.add_argument("--dead-after", type=float, default=None, help="seconds (default: the run's)")
    wait.add_argument("--report-every", type=float, default=BARRIER_REPORT_S, help="seconds between progress lines")
    wait.add_argument("--print-data", action="store_true", help="print the arrivals' data as key<TAB>value lines")
    wait.add_argument("--planned", type=planned_nodes, default=None, help=PLANNED_HELP)
    partner = _barrier_parser(
        subparsers, "partner-failed", cmd_partner_failed, "until another node arrives with a failed part"
    )
    partner.add_argument("--ranks", type=int_list, default=None, help="comma-separated (default: every other rank)")
    partner.add_argument("--key", required=True, help="the arrival's data field that holds the part's exit code")
    partner.add_argument("--poll", type=float, default=0.5)
    fail = _barrier_parser(subparsers, "fail", cmd_fail, "record this rank's failure on its way out")
    fail.add_argument("--reason", required=True)
    fail.add_argument("--exit-code", type=int, required=True)
    fail.add_argument("--pid", type=int, default=None)
    stop = _run_parser(subparsers, "stop", cmd_stop, "ask the whole run to stop", rank_required=False)
    stop.add_argument("--reason", required=True)
    stop.add_argument("--if-running", action="store_true", help="only a run whose master beats (else exit 4)")
    finish = _run_parser(subparsers, "finish", cmd_finish, "the master: the run ended well", rank_required=False)
    finish.add_argument("--reason", required=True)
    _run_parser(subparsers, "fence", cmd_fence, "exit 0 while the run is the log path's (4: superseded)", False)
    members = _run_parser(subparsers, "members", cmd_members, "who is in the next step (the master's plan)")
    members.add_argument("--wait-all", type=float, default=None, help="seconds to wait for every rank to join")
    members.add_argument("--poll", type=float, default=0.5)
    members.add_argument("--planned", type=planned_nodes, default=None, help=PLANNED_HELP)
    evict = _run_parser(subparsers, "evict", cmd_evict, "declare a rank dead")
    evict.add_argument("--reason", required=True)
    evict.add_argument("--by-rank", type=int, default=0)
    show = subparsers.add_parser("record", help="the run record as key<TAB>value lines")
    show.add_argument("--log-path", required=True)
    show.add_argument("--group", choices=GROUPS, default=None, help=GROUP_HELP)
    show.add_argument("--run-id", default=None)
    show.set_defaults(func=cmd_record)
    status = subparsers.add_parser("status", help="ranks, liveness by observation, last barrier")
    status.add_argument("--log-path", required=True)
    status.add_argument("--group", choices=GROUPS, default=None, help=GROUP_HELP)
    status.add_argument("--run-id", default=None)
    status.add_argument("--window", type=float, default=None, help="seconds to watch heartbeats")
    status.set_defaults(func=cmd_status)


def _add_node_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--group", choices=GROUPS, default=None, help=GROUP_HELP)
    parser.add_argument("--num-nodes", type=int, required=True)
    parser.add_argument("--rank-weights", type=int_list, required=True)
    parser.add_argument("--host", default=None, help="default: hostname")
    parser.add_argument("--addr", default=None, help="default: the address of the default route")
    parser.add_argument("--pid", type=int, required=True, help="the node's long-lived process (run.sh: $$)")
    parser.add_argument("--vllm-port", type=int, default=None)
    parser.add_argument("--poll", type=float, default=0.2)


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


def _barrier_parser(
    subparsers: argparse._SubParsersAction, name: str, func: Command, help_text: str
) -> argparse.ArgumentParser:
    parser = _run_parser(subparsers, name, func, help_text)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--phase", required=True)
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
