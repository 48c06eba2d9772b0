"""The process groups of a launched training, torchrun's workers included.

torchrun starts every worker in a session of its own, so signalling the group
we launched misses them, and a torchrun killed before it stops its workers
leaves them running with no parent. The launcher therefore makes itself a
child subreaper (orphaned descendants are re-parented to it, not to init),
lists its descendants' process groups from /proc while the training runs, and
stops all of them.

    become_subreaper()
    groups = descendant_groups(os.getpid())   # e.g. {4102, 4107}
    stop_groups(groups, grace_s=10)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
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


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) of every process, from /proc."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def descendant_groups(root: int) -> set[int]:
    """Process groups of the live (not zombie) descendants of `root`, without root's own group."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    own = os.getpgid(root)
    groups: set[int] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        _, pgid, state = table[pid]
        if state != "Z" and pgid != own:
            groups.add(pgid)
        stack.extend(children.get(pid, []))
    return groups


def groups_alive(groups: set[int]) -> set[int]:
    """The groups of `groups` that still have a live (not zombie) member."""
    return {pgid for (_, pgid, state) in _processes().values() if state != "Z"} & groups


def signal_groups(groups: set[int], sig: signal.Signals) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def stop_groups(groups: set[int], grace_s: float) -> None:
    """SIGTERM every group, wait up to `grace_s` for them to end, SIGKILL what is left."""
    signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while groups_alive(groups) and time.monotonic() < deadline:
        reap_adopted()
        time.sleep(0.1)
    left = groups_alive(groups)
    if left:
        log.warning("process groups %s ignored SIGTERM for %.0f s; sending SIGKILL", sorted(left), grace_s)
        signal_groups(left, signal.SIGKILL)
    reap_adopted()


def reap_adopted(keep: frozenset[int] = frozenset()) -> None:
    """Collect our exited children except `keep` (the launched process, which Popen waits for itself):
    orphans adopted as subreaper would stay zombies otherwise."""
    me = os.getpid()
    for pid, (ppid, _, state) in _processes().items():
        if ppid == me and state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
