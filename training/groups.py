"""The process groups of a launched training, torchrun's workers included.

torchrun starts every worker in a session of its own, so signalling the group
we launched misses them, and a torchrun killed before it stops its workers
leaves them running with no parent. The launcher therefore makes itself a
child subreaper (orphaned descendants are re-parented to it, not to init),
lists its descendants' process groups (psutil) while the training runs, and
stops all of them.

A group is recorded with its leader's start time (`Group`; clock ticks after
boot, /proc/<pid>/stat field 22, the unit coordinator/driver/procs.py compares), and is
signalled only while its id does not name another process: a pid reused after
the group ended is never signalled.

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

import psutil

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


def start_ticks(proc: psutil.Process) -> int:
    """`proc`'s start time in clock ticks after boot, as run.sh records it (driver/procs.py reads field 22 of
    /proc/<pid>/stat). psutil gives seconds since the epoch (boot time + ticks / CLK_TCK): exact back to ticks."""
    return round((proc.create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK"))


def _leader_start(pid: int) -> int | None:
    """The start time of the process `pid` (a zombie's too); None when no process has that id."""
    try:
        return start_ticks(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return None


def _pgid(proc: psutil.Process) -> int | None:
    """`proc`'s process group (psutil has no accessor for it); None when it is gone."""
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def _is_live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def leader_group(pid: int) -> Group:
    """The group led by `pid` (a process started in a session of its own), with its start time."""
    return Group(pid, _leader_start(pid))


def descendant_groups(root: int) -> set[Group]:
    """Process groups of the live (not zombie) descendants of `root`, without root's own group."""
    own = os.getpgid(root)
    groups: set[Group] = set()
    for proc in psutil.Process(root).children(recursive=True):
        pgid = _pgid(proc)
        if pgid is not None and pgid != own and _is_live(proc):
            groups.add(Group(pgid, _leader_start(pgid)))
    return groups


def _is_ours(group: Group) -> bool:
    """False when the group's id now names another process than its recorded leader (a reused pid).
    With no process of that id, members that outlived the leader are still the group: Linux does not
    reuse a pid while a group of that id has members."""
    now = _leader_start(group.pgid)
    return now is None or now == group.start


def groups_alive(groups: set[Group]) -> set[Group]:
    """The groups of `groups` that still have a live (not zombie) member and are still ours."""
    wanted = {group.pgid for group in groups}
    live = {pgid for proc in psutil.process_iter() if (pgid := _pgid(proc)) in wanted and _is_live(proc)}
    return {group for group in groups if group.pgid in live and _is_ours(group)}


def signal_groups(groups: set[Group], sig: signal.Signals) -> None:
    """Send `sig` to each group that is still ours; a group whose id now names another process is skipped."""
    for group in groups:
        if not _is_ours(group):
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
    exited = [child for child in psutil.Process().children() if child.pid not in keep and not _is_live(child)]
    psutil.wait_procs(exited, timeout=0)  # waitpid on each: they are our children
