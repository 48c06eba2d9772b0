"""`run.sh --stop --log-path L`: stop the run on L (every node), at once and cleanly.

A running multi-node run is asked through its stop request (each node's heartbeat sees it
within an interval and stops its node: exit 143); else a single node's run.sh is sent SIGTERM:
the one that owns a role of L on this host (`run/rank_*/owner.<role>`: host, pid, start time).
An earlier multi-node run's record (it finished, was stopped, or its master is gone) never
hides a live single-node run. The messages are run.sh's cmd_stop's.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import traceback
from pathlib import Path

from coordinator.cluster import ClusterError
from coordinator.driver import say
from coordinator.driver.cli import Args
from coordinator.membership import pid_started
from coordinator.protocol_cli import GROUPS, ask_stop, protocol_root, report
from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.layout import Layout, owner_role


def stop_run(args: Args, root: str) -> None:
    """Stop the run on `args.log` (as given, unchecked by `validate`). `root` is the repository (the Bash ran
    the protocol's CLI from it; here it runs in-process). Raises say.BadInput for a log path that is no
    existing absolute folder, say.Die(1) when a run's stop could not be asked or nothing runs."""
    log = args.log
    if not (log.startswith("/") and os.path.isdir(log)):
        raise say.BadInput(
            f"--stop needs the --log-path of a run (an existing absolute path; got '{log}'); "
            "give the --log-path the run was started with"
        )
    if ask_multi_node(log):
        say.log("every node of the run stops within a heartbeat interval; resume later with --resume")
        return
    if not signal_owners(log):
        raise say.Die(1, f"nothing to stop: no run.sh of --log-path {log} runs on this host")


def ask_multi_node(log: str) -> bool:
    """Ask every running multi-node run recorded on `log` to stop: --rl-phase both's, then a split
    deployment's rollout and update runs. True when one was asked (or had been already); an earlier run's
    record is skipped, saying why."""
    layout, asked = Layout(log), False
    reason = f"run.sh --stop by {user_name()}@{socket.gethostname()}"
    for group in ("", *GROUPS):
        if not (layout.role(group) if group else layout).run_record.is_file():
            continue
        where = str(protocol_root(log, group)) if group else log  # as `stop --group` names the run's folder
        try:
            ask_stop(where, reason, os.getpid(), if_running=True)
        except (ConfigError, ClusterError) as exc:
            if report(exc) != Exit.RUN_NOT_RUNNING:
                raise say.Die(1, f"could not ask the run on {log} to stop") from None
            continue
        except Exception:  # the CLI's traceback, then run.sh's error
            traceback.print_exc()
            raise say.Die(1, f"could not ask the run on {log} to stop") from None
        asked = True
    return asked


def signal_owners(log: str) -> bool:
    """SIGTERM to each run.sh that owns a role of `log` on this host (the same pid and start time as its
    owner record, so never a reused pid); True when one was sent."""
    sent = False
    for path in Layout(log).owners():
        owner = read_owner(path)
        if owner is None:
            continue
        host, pid, start = owner
        if host != socket.gethostname() or str(pid_started(pid)) != start:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
        sent = True
        say.log(f"sent SIGTERM to run.sh (pid {pid}, {owner_role(path.name)})")
    return sent


def read_owner(path: Path) -> tuple[str, int, str] | None:
    """(host, pid, start time) of an owner record's first line, None for anything else (an older run's
    owner.lock, a folder, a record being written)."""
    try:
        line = path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0] if path.is_file() else ""
    except OSError:
        return None
    parts = line.split(maxsplit=2)
    if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit() or int(parts[1]) <= 0:
        return None
    return parts[0], int(parts[1]), parts[2].rstrip()


def user_name() -> str:
    """This user's name, as `id -un` prints it (the uid when it has none)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
