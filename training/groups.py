"""The process groups of a launched training, torchrun's workers included.

torchrun starts every worker in a session of its own, so signalling the group
we launched misses them, and a torchrun killed before it stops its workers
leaves them running with no parent. The launcher therefore makes itself a
child subreaper (orphaned descendants are re-parented to it, not to init),
lists its descendants' process groups from /proc while the training runs, and
stops all of them.

A group is recorded with its leader's start time (`Group`; /proc/<pid>/stat
field 22, clock ticks after boot), and is signalled only while its id does not
name another process: a pid reused after the group ended is never signalled.

    become_subreaper()
    groups = descendant_groups(os.getpid())   # e.g. {Group(4102, 81234), Group(4107, 81240)}
    stop_groups(groups, grace_s=10)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux prctl); False where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True, order=True)
class Group:
    """A process group we started: its id and its leader's start time (None when the leader had
    already exited when the group was found: then it is signalled only while no process has its id)."""

    pgid: int
    start: int | None

    def record(self) -> str:
        """One line of `<log>.pgid` ("pgid leader_start_time", "-" for no start time), as run.sh reads it."""
        return f"{self.pgid} {'-' if self.start is None else self.start}\n"


@dataclass(frozen=True)
class _Proc:
    ppid: int
    pgid: int
    state: str
    start: int


def _read_proc(pid: int) -> _Proc | None:
    """Parent, group, state and start time of `pid`; None when it is gone."""
    try:
        # the fields after the command name (which may hold spaces): field 3 (state) is fields[0]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return _Proc(int(fields[1]), int(fields[2]), fields[0], int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def _processes() -> dict[int, _Proc]:
    """pid -> parent, group, state and start time of every process, from /proc."""
    table = {int(entry.name): _read_proc(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    return {pid: proc for pid, proc in table.items() if proc is not None}


def leader_group(pid: int) -> Group:
    """The group led by `pid` (a process started in a session of its own), with its start time."""
    proc = _read_proc(pid)
    return Group(pid, proc.start if proc else None)


def descendant_groups(root: int) -> set[Group]:
    """Process groups of the live (not zombie) descendants of `root`, without root's own group."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    own = os.getpgid(root)
    groups: set[Group] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        proc = table[pid]
        if proc.state != "Z" and proc.pgid != own:
            leader = table.get(proc.pgid)
            groups.add(Group(proc.pgid, leader.start if leader else None))
        stack.extend(children.get(pid, []))
    return groups


def _is_ours(group: Group, table: dict[int, _Proc]) -> bool:
    """False when the group's id now names another process than its recorded leader (a reused pid).
    With no process of that id, members that outlived the leader are still the group: Linux does not
    reuse a pid while a group of that id has members."""
    leader = table.get(group.pgid)
    return leader is None or leader.start == group.start


def groups_alive(groups: set[Group]) -> set[Group]:
    """The groups of `groups` that still have a live (not zombie) member and are still ours."""
    table = _processes()
    live = {proc.pgid for proc in table.values() if proc.state != "Z"}
    return {group for group in groups if group.pgid in live and _is_ours(group, table)}


def signal_groups(groups: set[Group], sig: signal.Signals) -> None:
    """Send `sig` to each group that is still ours; a group whose id now names another process is skipped."""
    table = _processes()
    for group in groups:
        if not _is_ours(group, table):
            log.warning("process group %d: its pid now names another process; not sending %s", group.pgid, sig.name)
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group.pgid, sig)


def stop_groups(groups: set[Group], grace_s: float) -> None:
    """SIGTERM every group, wait up to `grace_s` for them to end, SIGKILL what is left (each only while ours)."""
    signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while groups_alive(groups) and time.monotonic() < deadline:
        reap_adopted()
        time.sleep(0.1)
    left = groups_alive(groups)
    if left:
        log.warning(
            "process groups %s ignored SIGTERM for %.0f s; sending SIGKILL", sorted(g.pgid for g in left), grace_s
        )
        signal_groups(left, signal.SIGKILL)
    reap_adopted()


def reap_adopted(keep: frozenset[int] = frozenset()) -> None:
    """Collect our exited children except `keep` (the launched process, which Popen waits for itself):
    orphans adopted as subreaper would stay zombies otherwise."""
    me = os.getpid()
    for pid, proc in _processes().items():
        if proc.ppid == me and proc.state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
