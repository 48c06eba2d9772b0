"""Process groups the driver starts: each in its own session, recorded, and stopped exactly.

    groups = Groups(run_dir)
    job = groups.start("rollout", cmd, run_dir / "logs" / "rollout.log")   # pid == pgid, in groups.json
    job.poll()                        # None while its leader runs, else its exit code (signal n: 128 + n)
    groups.stop("rollout", grace_s=10)   # SIGTERM (+ SIGCONT), grace, SIGKILL; the record goes
    claim(run_dir, "rollout")         # owner.rollout names this process; Claimed / LockBusy otherwise

The records are files other tools read too (run.sh --stop the owner records, the dashboard and the e2e
tests the groups): `<run_dir>/groups.json` holds each running group's id and leader's start time
(coordinator/groupfile.py), and `<run_dir>/owner.<role>` holds "host pid start_time". A pid with its start
time names one process even after the pid is reused, so a group is signalled only while its recorded leader
(or, the leader gone, members that outlived it) is still the one recorded; nothing that was not recorded is
ever signalled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from coordinator import groupfile
from coordinator.driver import say
from coordinator.groupfile import Record
from rollout_engine.files import rewrite
from rollout_engine.layout import GROUPS_NAME
from rollout_engine.shared_read import make_dirs

#: Bash's `wait` on a pid that is not its child; Group.poll's code for a group it did not start
NOT_OUR_CHILD = 127
#: seconds between looks at a group that was asked to stop
STOP_POLL_S = 0.1
#: seconds to wait for a SIGKILLed leader to be reaped (one stuck in the kernel is left to later)
REAP_S = 10.0
#: seconds between tries of the owner lock
LOCK_POLL_S = 0.05
#: seconds to wait for the lock of the group records (held for one read and one write)
RECORDS_WAIT_S = 30.0


def child_env(root: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of a Baton child: `environ` with the repository first on PYTHONPATH, then the user's
    folders (their own environment's package: docs/environments.md), in their order, each once."""
    theirs = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {**environ, "PYTHONPATH": os.pathsep.join([root, *dict.fromkeys(theirs)])}


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parens):
    [0] is field 3 (state), [2] field 5 (pgrp), [19] field 22 (start time); None without the process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    _, sep, rest = data.rpartition(b") ")  # the name is any bytes, not always UTF-8
    fields = rest.decode("ascii", "replace").split()
    return fields if sep and len(fields) > 19 else None


def start_time(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (with the pid, it names one process)."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None else None


def _processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process (as `ps -e` lists them: thread-group leaders)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            fields = _stat_fields(name)
            if fields is not None:
                yield int(name), fields


def _members(pgid: int, *, zombies: bool) -> list[int]:
    """The pids of group `pgid`; zombies (which only wait for their parent to reap them) when asked."""
    return [pid for pid, fields in _processes() if fields[2] == str(pgid) and (zombies or fields[0] not in ("Z", "X"))]


def group_members(pgid: int) -> list[int]:
    """The pids of group `pgid`'s live processes (zombies do not count)."""
    return _members(pgid, zombies=False) if pgid > 0 else []


def group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` runs (zombies do not count)."""
    return bool(group_members(pgid))


def group_ours(pgid: int, start: str) -> bool:
    """False when pid `pgid` now names another process than the leader recorded with `start` (a reused
    pid). With no process of that pid, members that outlived the leader are still the recorded group:
    Linux does not reuse a pid while a group of that id has members. Ids 0 and 1 are never ours (a
    signal to group 0 is one to the caller's own group)."""
    if pgid <= 1:
        return False
    now = start_time(pgid)
    return now is None or now == start


def signal_group(pgid: int, start: str, sig: int) -> bool:
    """Send `sig` to group `pgid` while it runs and is the group recorded with `start` (group_ours);
    False when nothing was sent. A SIGTERM is followed by a SIGCONT (as systemd does), so a stopped
    group (SIGSTOP, ^Z) handles it now."""
    if not (group_ours(pgid, start) and group_alive(pgid)):
        return False
    try:
        os.killpg(pgid, sig)
    except OSError:
        return False
    if sig == signal.SIGTERM:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGCONT)
    return True


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes of the TCP sockets listening on `port` (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... inode; st 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    return inodes


def group_listens(pgid: int, port: int) -> bool:
    """True when a process of group `pgid` holds the listening TCP socket of `port` (so that whoever
    answers there is that group)."""
    inodes = _listening_inodes(port)
    if not inodes or pgid <= 0:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in _members(pgid, zombies=True):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False


def _exit_code(returncode: int) -> int:
    """A shell's exit status for a Popen return code (killed by signal n: 128 + n)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class Group:
    """A process group: its name, id (its leader's pid), leader's start time and log."""

    name: str
    pgid: int
    start: str
    log: Path | None
    popen: subprocess.Popen | None = None

    def poll(self) -> int | None:
        """The leader's exit code once it exited (killed by signal n: 128 + n), None while it runs.
        A group this process did not start (no popen) has no code to read: NOT_OUR_CHILD (127, as
        Bash's `wait` says) once its recorded leader is gone."""
        if self.popen is not None:
            code = self.popen.poll()
            return None if code is None else _exit_code(code)
        return None if start_time(self.pgid) == self.start else NOT_OUR_CHILD


class Groups:
    """The groups recorded under one run directory (`<run_dir>/groups.json`: coordinator/groupfile.py)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.file = self.run_dir / GROUPS_NAME
        self._started: dict[str, Group] = {}

    def records(self) -> dict[str, Record]:
        """Every recorded group by name."""
        return groupfile.read(self.file)

    def _write(self, name: str, record: Record | None) -> None:
        """Record `name` as `record` (None: forget it)."""
        self._change(name, lambda _: record)

    def _change(self, name: str, change: Callable[[Record | None], Record | None]) -> None:
        """Set the record of `name` to `change(its record)` (None: forget it): the file read and rewritten in place
        under its lock, as the two runs of a split deployment share a rank's directory. One create on the shared
        path, at a node's first start; none at each start of a phase (a file a group made a create and an unlink
        there every time)."""
        make_dirs(self.run_dir)
        fd = _lock(self.file, RECORDS_WAIT_S)
        if fd is None:
            raise say.Die(
                1,
                f"waited {RECORDS_WAIT_S:g}s for the lock {self.file} to record the group {name}; another process "
                f"holds it (check: fuser {self.file})",
            )
        try:
            size = os.fstat(fd).st_size
            records = dict(groupfile.parse(os.pread(fd, size, 0) if size else b"") or {})
            old = records.get(name)
            new = change(old)
            if new == old:
                return
            if new is None:
                del records[name]
            else:
                records[name] = new
            rewrite(fd, groupfile.encode(records))
        finally:
            os.close(fd)

    def note(self, name: str, holds: str) -> None:
        """Note on the record of `name` what its group holds now ("": nothing); no record, nothing noted. It goes
        with the record when the group stops, so a later run never reads it of another group."""
        self._change(name, lambda old: None if old is None else dataclasses.replace(old, holds=holds))

    def holds(self, name: str) -> str:
        """What the record of `name` notes its group holds ("" without a record or a note)."""
        record = self._read(name)
        return record.holds if record is not None else ""

    def take_over_legacy(self) -> None:
        """Record in groups.json the groups that a Baton before it recorded a file each (`pids/<name>.pgid`:
        "pgid start"), and vLLM's weights (`vllm.weights`), then remove those files: a run resumed after an
        upgrade stops or reuses them as its own, where it would not see them (a vLLM left holding the port). A
        name recorded already keeps its record."""
        legacy = self.run_dir / "pids"
        files = sorted(legacy.glob("*.pgid")) if legacy.is_dir() else []
        weights = self.run_dir / "vllm.weights"
        for file in files:
            words = file.read_text(errors="replace").split()
            if words and words[0].isdigit():
                name, record = file.name.removesuffix(".pgid"), Record(int(words[0]), words[1] if words[1:] else "")
                self._change(name, lambda old, record=record: old or record)
            file.unlink(missing_ok=True)
        if weights.is_file():
            lines = weights.read_text(errors="replace").splitlines()
            if lines and lines[0] and not self.holds("vllm"):
                self.note("vllm", lines[0])
            weights.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            legacy.rmdir()

    def _read(self, name: str) -> Record | None:
        """The record of `name`; None without one."""
        return self.records().get(name)

    def start(self, name: str, cmd: Sequence[str], log: Path | None, env: Mapping[str, str] | None = None) -> Group:
        """Start `cmd` in a new session (its own process group: pid == pgid) with stdin from /dev/null
        and its output appended to `log` (None: to the driver's stderr); record the group. `env` None
        inherits os.environ, else the child gets exactly `env`. A command that cannot be executed is
        Die(1) (Bash's setsid would have exited 127)."""
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            # the child keeps its own descriptor of the log; ours closes when it has started
            out = stack.enter_context(open(log, "ab")) if log is not None else 2
            try:
                popen = subprocess.Popen(
                    list(cmd),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(env) if env is not None else None,
                    start_new_session=True,
                )
            except OSError as exc:
                raise say.Die(1, f"cannot start {name} ({cmd[0]}): {exc.strerror or exc}") from exc
        # not reaped yet, so /proc/<pid>/stat is there even when it already exited
        group = Group(name, popen.pid, start_time(popen.pid) or "", log, popen)
        try:
            self._write(name, Record(group.pgid, group.start))
        except BaseException:  # no record names it, so no clean-up would find it: it ends with this start
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            raise
        self._started[name] = group
        return group

    def group(self, name: str) -> Group | None:
        """The group this object started under `name`, while the record still names it."""
        group = self._started.get(name)
        if group is None or self.recorded(name) != (group.pgid, group.start):
            return None
        return group

    def recorded(self, name: str) -> tuple[int, str] | None:
        """(pgid, leader's start time) of the record of `name`; None without a usable record."""
        record = self._read(name)
        if record is None or record.pgid <= 0:
            return None
        return record.pgid, record.start

    def leader_alive(self, name: str) -> bool:
        """True while the recorded group's leader runs: the same pid with the same start time."""
        record = self.recorded(name)
        return record is not None and bool(record[1]) and start_time(record[0]) == record[1]

    def signal(self, name: str, sig: int) -> bool:
        """signal_group on the recorded group of `name`; False when nothing was sent."""
        record = self.recorded(name)
        return record is not None and signal_group(record[0], record[1], sig)

    def listens(self, name: str, port: int) -> bool:
        """group_listens on the recorded group of `name`."""
        record = self.recorded(name)
        return record is not None and group_listens(record[0], port)

    def stop(self, name: str, grace_s: float = 20) -> None:
        """SIGTERM the recorded group, wait up to `grace_s` seconds, then SIGKILL what is left; reap
        the leader when it is our child; forget the record. A record whose pid now names another
        process is never signalled (a warning says so). No record: nothing to do."""
        if self._read(name) is None:
            return
        record = self.recorded(name)
        if record is not None and signal_group(*record, signal.SIGTERM):
            pgid, start = record
            deadline = time.monotonic() + grace_s
            while group_ours(pgid, start) and group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(STOP_POLL_S)
            if group_ours(pgid, start) and group_alive(pgid):
                say.warn(f"{name} (group {pgid}) ignored SIGTERM for {grace_s:g}s; sending SIGKILL")
                signal_group(pgid, start, signal.SIGKILL)
                time.sleep(0.2)
            self._reap(name, pgid, REAP_S)
        elif record is not None and not group_ours(*record):
            say.warn(f"{name}: the recorded pid {record[0]} now names another process; not signalled")
        else:
            self._reap(name, record[0] if record is not None else -1, 0)
        self._write(name, None)
        self._started.pop(name, None)

    def stop_stale(self, name: str) -> None:
        """A record left by a run that died: stop its group when the leader is verifiably ours;
        otherwise only forget the record (warning when its group still has members)."""
        found = self._read(name)
        if found is None:
            return
        if self.leader_alive(name):
            say.warn(f"{name} (group {found.pgid}) was left running by an earlier run; stopping it")
            self.stop(name, 10)
            return
        record = self.recorded(name)
        if record is not None and group_alive(record[0]):
            say.warn(f"{name}: recorded group {record[0]} outlived its leader; not ours to stop, check it")
        self._write(name, None)
        self._started.pop(name, None)

    def forget(self, name: str) -> None:
        """Remove the record of `name` (its group exited) and reap its leader when it is our child."""
        record = self.recorded(name)
        self._reap(name, record[0] if record is not None else -1, 0)
        self._write(name, None)
        self._started.pop(name, None)

    def _reap(self, name: str, pgid: int, wait_s: float) -> None:
        """Collect the exit status of our child leading group `pgid` (so no zombie stays), waiting up to
        `wait_s` seconds for it to exit."""
        group = self._started.get(name)
        if group is None or group.popen is None or (pgid > 0 and group.pgid != pgid):
            return
        if wait_s <= 0:
            group.popen.poll()
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            group.popen.wait(timeout=wait_s)


class Claimed(Exception):
    """Another live process on this host owns the role."""

    def __init__(self, owner_pid: int, role: str = "") -> None:
        super().__init__(f"pid {owner_pid} owns {role}")
        self.owner_pid = owner_pid
        self.role = role


class LockBusy(Exception):
    """The owner lock stayed busy; `message` is the line run.claim prints ("[baton] error: ...")."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _parse_owner(data: bytes) -> tuple[str, str, str]:
    """(host, pid, start time) of an owner record's bytes; empty words for what is missing."""
    words = [*data.decode("utf-8", "replace").split(), "", "", ""]
    return words[0], words[1], words[2]


def _owner(file: Path) -> tuple[str, str, str] | None:
    """(host, pid, start time) of an owner record; None without one."""
    try:
        return _parse_owner(file.read_bytes())
    except OSError:
        return None


def _lives_here(host: str, pid: str, start: str) -> bool:
    """The recorded process runs on this host: the same pid with the same start time (not a reused pid)."""
    return host == socket.gethostname() and pid.isdigit() and start_time(int(pid)) == start


def _lock(file: Path, wait_s: float, *, create: bool = True) -> int | None:
    """A descriptor of `file` (created when missing, if `create`) holding its exclusive flock, the file still named
    `file` (one removed while this waited is let go, and the name taken anew); None after `wait_s` seconds, or
    without the file when not `create`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:  # O_CREAT only for a file that is missing: on NFS or Lustre an open that may create is a create's call
            fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            try:
                fd = os.open(file, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT, 0o644)
            except FileNotFoundError:
                return None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(LOCK_POLL_S)
        try:
            named = os.stat(file)
        except FileNotFoundError:
            named = None
        held = os.fstat(fd)
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)


def claim(run_dir: Path, role: str, wait_s: float = 10) -> None:
    """Make this process the owner of `role` under `run_dir` (owner.<role>: "host pid start_time").
    Raises Claimed while another live process on this host owns it. The check and the write are one
    step under a flock on the record itself (one file a role, rewritten in place: a node's start makes one
    create a role on the shared path); when that lock is not free within `wait_s` seconds, nothing is
    claimed and LockBusy says which lock."""
    run_dir = Path(run_dir)
    make_dirs(run_dir)  # every node makes <log>/run/ at its start
    file = run_dir / f"owner.{role}"
    fd = _lock(file, wait_s)
    if fd is None:
        raise LockBusy(
            f"[baton] error: waited {wait_s:g}s for the lock {file} to claim {role}; another process holds it "
            f"(check: fuser {file})"
        )
    try:
        host, me = socket.gethostname(), os.getpid()
        owner = _parse_owner(os.pread(fd, 4096, 0))
        if _lives_here(*owner) and int(owner[1]) != me:
            raise Claimed(int(owner[1]), role)
        rewrite(fd, f"{host} {me} {start_time(me) or ''}\n".encode())
    finally:
        os.close(fd)


def release(run_dir: Path, role: str, wait_s: float = 10) -> None:
    """Forget the owner record of `role` if it is this process's; under the record's lock, so that a claim
    waiting on it takes the name anew rather than writing into the removed file."""
    file = Path(run_dir) / f"owner.{role}"
    owner = _owner(file)
    if owner is None or owner[0] != socket.gethostname() or owner[1] != str(os.getpid()):
        return
    fd = _lock(file, wait_s, create=False)
    if fd is None:
        return
    try:
        owner = _parse_owner(os.pread(fd, 4096, 0))
        if owner[0] == socket.gethostname() and owner[1] == str(os.getpid()):
            file.unlink(missing_ok=True)
    finally:
        os.close(fd)
