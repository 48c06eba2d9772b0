"""`run.sh --check-shared-fs --log-path L --num-nodes N (--master | --worker R)`: every node at once measures what
the log path's filesystem shows it of rank 0's writes (coordinator/fscheck.py), prints the findings and what they
mean, and exits 2 when a setting is shorter than the staleness measured (naming it and the mount options).

Rank 0 makes `<log>/fscheck/<id>/` and names it in `<log>/fscheck/current.json`; the others take the check that
file names once it is younger than they are (made at most WAIT_S, 120 s, before their start: they may start
first).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from coordinator.driver import cli, say
from coordinator.fscheck import FINDINGS, Findings, follow, lead, load_findings, save_findings, verdict
from rollout_engine.defaults import DEAD_AFTER_S, HEARTBEAT_S
from rollout_engine.files import save_text
from rollout_engine.shared_read import read_fresh

#: how long each wait of the check may take (s): what is not seen by then is reported as "not within"
BUDGET_S = 8.0
#: how long a node waits for rank 0's check to appear, and rank 0 for the others' answers
WAIT_S = 120.0


def check_shared_fs(args: cli.Args, env: Mapping[str, str] = os.environ) -> int:
    """Validate the flags the check takes, run this node's side, print the findings; the exit code."""
    log = args.log
    if not log.startswith("/"):
        raise say.BadInput(f"--check-shared-fs needs an absolute --log-path (got '{log}'): the run's log path")
    cli._validate_path_text("--log-path", log)
    nodes = cli._raw(args, "--num-nodes")
    if not (cli.is_int(nodes, 2)):
        raise say.BadInput(
            f"--check-shared-fs needs --num-nodes N >= 2 (got '{nodes or 1}'): it measures what one node sees of "
            "another's writes; run it on every node at once"
        )
    args.num_nodes = int(nodes)
    cli._validate_rank(args, nodes, env)
    cli.validate_env(env)
    root = Path(log) / "fscheck"
    dead_after, heartbeat = DEAD_AFTER_S.seconds(env), HEARTBEAT_S.seconds(env)
    if args.rank == 0:
        check_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{socket.gethostname()}-{os.getpid()}"
        folder = root / check_id
        folder.mkdir(parents=True)
        save_text(root / "current.json", json.dumps({"id": check_id, "time": time.time()}) + "\n")
        say.log(f"checking {log} with {args.num_nodes - 1} other nodes (check {check_id}); start them now")
        findings = lead(folder, args.num_nodes, BUDGET_S, wait_s=WAIT_S)
        save_findings(folder, findings)
    else:
        folder = _current(root, time.time())
        say.log(f"rank {args.rank}: answering rank 0's check {folder.name}")
        follow(folder, args.rank, BUDGET_S, wait_s=WAIT_S)
        findings = _findings(folder / FINDINGS)
    for line in describe(findings):
        print(line, flush=True)
    problems = verdict(findings, dead_after, heartbeat)
    for problem in problems:
        print(f"[baton] error: {problem}", flush=True)
    silent = [pair.rank for pair in findings.pairs if pair.round_trip_s is None]
    if silent:
        print(f"[baton] error: ranks {silent} did not answer within {WAIT_S:.0f} s: start them too", flush=True)
    if not problems and not silent:
        say.log(f"{log} is fit for a multi-node run at BATON_DEAD_AFTER_S={dead_after:g}")
    return 2 if problems else 1 if silent else 0


def _current(root: Path, started: float) -> Path:
    """The check rank 0 started within WAIT_S of `started` (this node's start)."""
    deadline = started + WAIT_S
    while time.time() < deadline:
        try:
            current = json.loads(read_fresh(root / "current.json"))
            if float(current["time"]) >= started - WAIT_S:
                return root / str(current["id"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.2)
    raise say.Die(1, f"no check of rank 0 appeared in {root} within {WAIT_S:.0f} s; start rank 0 (--master) too")


def _findings(path: Path) -> Findings:
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        try:
            return load_findings(path)
        except (FileNotFoundError, ValueError, KeyError):
            time.sleep(0.2)
    raise say.Die(1, f"rank 0 wrote no findings at {path} within {WAIT_S:.0f} s")


def _delay(value: float | None, budget: float) -> str:
    return f"not within {budget:.0f} s" if value is None else f"{value:.2f} s"


def describe(findings: Findings) -> list[str]:
    """The findings, one block per other rank."""
    lines = [f"[baton] shared filesystem {findings.folder} (each wait at most {findings.budget_s:.0f} s):"]
    for pair in findings.pairs:
        b = findings.budget_s
        if pair.round_trip_s is None:
            lines.append(f"  rank {pair.rank}: did not answer within {b:.0f} s")
            continue
        locks = {True: "yes", False: "no (each node locks alone)", None: "unknown"}[pair.locks_shared]
        lines += [
            f"  rank {pair.rank} ({pair.host}) sees rank 0's writes:",
            f"    a new file, looked up by name:     {_delay(pair.new_by_name_s, b)}",
            f"    a new file, in a listing:          {_delay(pair.new_by_listing_s, b)}",
            f"    a deleted file, still there for:   {_delay(pair.deleted_visible_s, b)}",
            f"    a rewritten file, old content for: {_delay(pair.old_content_s, b)}",
            f"    locks shared with rank 0:          {locks}",
            f"    clock offset from rank 0:          {pair.clock_offset_s:+.3f} s (+- {pair.round_trip_s / 2:.3f})",
        ]
    return lines
