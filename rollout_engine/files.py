"""Durable file writes shared by every Baton module (docs/formats.md's rules).

    save_bytes(path, data)      # temp file in the same directory, fsync, rename, fsync dir
    save_text(path, text) / save_json(path, obj) / save_jsonl(path, rows)
    save_text(path, text, durable=False)   # atomic, no fsync
    overwrite_text(path, text)  # in place, no rename: a heartbeat, a status file, a node's records (below)
    rewrite(fd, data)           # the same on a descriptor already open (held under a lock)
    append_line(path, line)     # one O_APPEND write, then fsync
    appender = LineAppender(path); appender.append(line); appender.close()   # the same, the file kept open
                                # (a rank's journal: one writer, a line per episode)
    append_jsonl(path, obj)
    append_shared_jsonl(path, obj)   # the same under `<path>.lock`: metrics.jsonl (processes of one host)
    with shared_lock(path): ...      # an exclusive lock (across hosts only where the filesystem shares locks)
    read = read_jsonl(path)     # read.rows, read.torn (line numbers skipped)
    read = parse_jsonl(data)    # the same rule on bytes already read

Readers see the old file or the whole new one, never a mix (but for `overwrite_*`, whose readers skip what does
not parse).
Files are 0644:
the log path is shared with other nodes and users. `durable=False` keeps the
atomic rename and drops the fsyncs, for a file whose content is worthless after
a crash and must never wait for the disk: a heartbeat (an fsync waits for the
writeback of other processes' dirty data; under memory pressure on 2 cores it
took up to 26 s, long enough for the other nodes to count a live node dead).

`overwrite_text` rewrites a file in place: no rename and no fsync, and no create
but the first, for a file rewritten every second or few by one writer on every
node (a heartbeat, a rollout's status file) or written once at a node's start (its
resolved config, serving.json). On a distributed filesystem creates and
renames are the metadata server's costly operations (Lustre's MDS); at 1,000
nodes the rename-per-write files made 2,400 of each a second. A reader may see
a mix of the old and new bytes for an instant: every reader of such a file
skips what does not parse and looks again (a heartbeat that reads differently
still means its writer is writing).

JSON lines have one torn-line rule: every line that parses is kept, a line that
does not (a write cut short by a crash) is skipped and reported, and it never
takes the next line with it: an append after a torn last line starts on a line
of its own.

Locks are `filelock` locks, that is flock(2). The Linux NFS client has sent
flock to the server as a whole-file POSIX byte-range lock since 2.6.12 (flock(2),
"NFS details"; fs/nfs/file.c nfs_flock), so they exclude processes on other
hosts exactly as fcntl/lockf locks do (both are local-only only under the
`local_lock=` mount option of nfs(5)). A filesystem without flock fails
loudly instead of falling back to filelock's marker files.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from rollout_engine.fence import check_fence
from rollout_engine.shared_read import make_dirs


@dataclass
class JsonlRead:
    """What `read_jsonl` found: the parsed rows and the torn lines it skipped."""

    rows: list[Any] = field(default_factory=list)
    #: 1-based line number of each row (rows[i] was on line numbers[i])
    numbers: list[int] = field(default_factory=list)
    #: 1-based numbers of the lines that did not parse
    torn: list[int] = field(default_factory=list)


def save_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` atomically and (unless `durable` is False) durably."""
    path = Path(path)
    try:  # the folder first only when it is missing: a heartbeat or a status file is rewritten in place every few s
        fd, tmp = _temp_file(path)
    except FileNotFoundError:
        make_dirs(path.parent)
        fd, tmp = _temp_file(path)
    try:
        if _UMASK & 0o644:  # a umask that takes some of 0644 away: the file is 0644 all the same
            os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def _temp_file(path: Path) -> tuple[int, str]:
    """A new temp file beside `path` (`.<name>.<random>.tmp`: readers skip dot files), created 0644 less the
    umask: mkstemp's 0600 took an fchmod per write, a call to the server for every heartbeat and status file."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name beside {path}")


def _create(path: Path) -> int:
    """A descriptor of `path` open for writing, created 0644 (its folder made first when missing); a file another
    writer created meanwhile is opened as it is."""
    flags = os.O_WRONLY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        make_dirs(path.parent)
        return _create(path)
    except FileExistsError:
        return os.open(path, flags)
    if _UMASK & 0o644:
        os.fchmod(fd, 0o644)
    return fd


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the process's umask, read once (it is set before anything is written)
_UMASK = _umask()


def save_text(path: str | Path, text: str, *, durable: bool = True) -> None:
    save_bytes(path, text.encode("utf-8"), durable=durable)


def overwrite_bytes(path: str | Path, data: bytes) -> None:
    """Rewrite `path` in place: the new bytes from offset 0, then the file cut to their length (a reader sees the
    old bytes, the new, or a mix it cannot parse). The first write creates the file by name, one create and no
    rename (at a node's start these files are most of its names): a reader may find it empty for an instant,
    which it skips as it skips a mix."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = _create(Path(path))
    try:
        rewrite(fd, data)
    finally:
        os.close(fd)


def rewrite(fd: int, data: bytes) -> None:
    """`overwrite_bytes` on an open descriptor (one held under a lock): the bytes from offset 0, then the cut."""
    view, offset = memoryview(data), 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
    os.ftruncate(fd, len(data))


def overwrite_text(path: str | Path, text: str) -> None:
    overwrite_bytes(path, text.encode("utf-8"))


def save_json(path: str | Path, obj: Any, *, durable: bool = True) -> None:
    save_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", durable=durable)


def save_jsonl(path: str | Path, rows: list[Any]) -> None:
    save_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def append_line(path: str | Path, line: str) -> None:
    """Append one line with a single write, then fsync.

    When the file does not end with a newline (a torn last line), the write
    starts with one, so the new line is not glued to the torn one.
    """
    appender = LineAppender(path)
    try:
        appender.append(line)
    finally:
        appender.close()


class LineAppender:
    """`append_line` for the one writer of a file that gets a line every few seconds (a rank's journal: a line
    per finished episode), through a descriptor kept open between lines: a write and an fsync per line, where
    opening each time costs eight calls (mkdir, stat, open, fstat, pread, write, fsync, close). A journal's
    appends are the calls of a rolling-out node that follow its episodes per second, not the protocol's clock
    (docs/multinode.md "Scale"). Thread-safe: the rollout writes from worker threads.

    The torn-tail check (does the file end with a newline?) runs when the file is opened. A write that fails
    or falls short closes the descriptor, so the next line opens the file again and starts on a line of its own.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def append(self, line: str) -> None:
        check_fence()  # a node of a superseded run appends nothing (rollout_engine.fence)
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                make_dirs(self.path.parent)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    size = os.fstat(self._fd).st_size
                    if size and os.pread(self._fd, 1, size - 1) != b"\n":
                        data = b"\n" + data
                except OSError:
                    self._close()
                    raise
            try:
                written = os.write(self._fd, data)
                if written != len(data):
                    raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes (disk full?)")
                os.fsync(self._fd)
            except OSError:
                self._close()
                raise

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:
        self._close()


def append_jsonl(path: str | Path, obj: Any) -> None:
    append_line(path, json.dumps(obj, ensure_ascii=False))


def shared_lock(path: str | Path) -> FileLock:
    """An exclusive lock on the file `path` (made 0644 if missing, never deleted), across processes and hosts."""
    return FileLock(path, mode=0o644, fallback_to_soft=False)


def append_shared_line(path: str | Path, line: str) -> None:
    """`append_line` under `<path>.lock`, for a file that several processes of one host append to
    (metrics.jsonl: a single node's rollout and its driver). No file is appended from two hosts
    (rollout_engine.metrics_log): not every shared filesystem shares locks between its clients."""
    with shared_lock(f"{path}.lock"):
        append_line(path, line)


def append_shared_jsonl(path: str | Path, obj: Any) -> None:
    append_shared_line(path, json.dumps(obj, ensure_ascii=False))


def read_jsonl(path: str | Path) -> JsonlRead:
    """Every line of `path` that parses as JSON; blank lines are ignored, the others are `torn`.

    Raises OSError when the file cannot be read (callers decide whether a missing file is empty).
    """
    return parse_jsonl(Path(path).read_bytes())


def parse_jsonl(data: bytes) -> JsonlRead:
    """`read_jsonl`'s rule applied to bytes already read (a prefix of a journal, say)."""
    read = JsonlRead()
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)  # bytes: a multi-byte character cut in two is a ValueError too
        except ValueError:
            read.torn.append(number)
            continue
        read.rows.append(row)
        read.numbers.append(number)
    return read


def fsync_dir(directory: str | Path) -> None:
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
