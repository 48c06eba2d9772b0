"""Process groups are recorded with their leader's start time and never signalled once their id names
another process (a reused pid)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from training.groups import (
    Group,
    descendant_groups,
    groups_alive,
    leader_group,
    reap_adopted,
    signal_groups,
    stop_groups,
)


def _start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here as coordinator/driver/procs.py reads it: the record's unit."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@contextmanager
def _session_leader() -> Iterator[subprocess.Popen]:
    """A `sleep` in a session (and process group) of its own, killed at the end whatever happened."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_groups_are_found_and_recorded_with_their_leaders_start_time() -> None:
    with _session_leader() as proc:
        group = Group(proc.pid, _start_time(proc.pid))
        assert leader_group(proc.pid) == group
        assert group in descendant_groups(os.getpid())
        assert group.record() == f"{proc.pid} {group.start}\n"
    assert Group(12, None).record() == "12 -\n"


def test_a_group_whose_pid_names_another_process_is_never_signalled() -> None:
    # the record of a group that ended, whose pid now names this other session leader
    with _session_leader() as proc:
        reused = Group(proc.pid, _start_time(proc.pid) - 1)
        assert groups_alive({reused}) == set()
        signal_groups({reused}, signal.SIGKILL)
        stop_groups({reused}, grace_s=0.2)
        assert proc.poll() is None, "a reused pid was signalled"
        leaderless = Group(proc.pid, None)  # found after its leader had exited: the pid was reused since
        stop_groups({leaderless}, grace_s=0.2)
        assert proc.poll() is None, "a reused pid was signalled"


def test_the_recorded_group_is_stopped() -> None:
    with _session_leader() as proc:
        group = leader_group(proc.pid)
        assert groups_alive({group}) == {group}
        stop_groups({group}, grace_s=5)
        assert groups_alive({group}) == set()


def test_members_that_outlive_their_leader_are_still_stopped(tmp_path: Path) -> None:
    # the leader starts a member in its group and exits: no process has the group's id, the group lives on
    script = f"sleep 300 & echo $! > {tmp_path / 'member'}"
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    group = leader_group(leader.pid)
    leader.wait()
    member = int((tmp_path / "member").read_text())
    try:
        assert os.getpgid(member) == group.pgid and groups_alive({group}) == {group}
        stop_groups({group}, grace_s=5)
        assert groups_alive({group}) == set()
    finally:
        if groups_alive({group}):
            os.kill(member, signal.SIGKILL)


def test_exited_children_are_reaped_except_the_one_popen_waits_for() -> None:
    kept, other = subprocess.Popen(["true"]), subprocess.Popen(["true"])
    children = [psutil.Process(kept.pid), psutil.Process(other.pid)]
    deadline = time.monotonic() + 10  # both `true`s exit at once: 10 s only bounds a hang
    while any(child.status() != psutil.STATUS_ZOMBIE for child in children) and time.monotonic() < deadline:
        time.sleep(0.01)
    reap_adopted(keep=frozenset({kept.pid}))
    assert children[0].status() == psutil.STATUS_ZOMBIE, "the kept child was reaped: Popen would lose its status"
    assert not children[1].is_running(), "an exited child stayed a zombie"
    assert kept.wait() == 0
    other.wait()
