"""The one way to read a small file another node of a shared log path wrote (docs/multinode.md "Filesystems").

    data = read_fresh(path)     # FileNotFoundError only when neither a listing nor the name finds it
    exists_either_way(path)     # a listing of its folder shows it, or its name does
    data = read_sealed(path, size, sha256)   # another node's sealed journal, once this client shows all of it
    make_dirs(path)             # mkdir -p where another node may be making the same folders

Imports nothing of Baton's, so that every module can use it (rollout_engine.fence included).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

#: how many times a read that met a stale handle is tried again (each a fresh lookup of the name)
STALE_TRIES = 5
#: how long a reader waits for another node's sealed file to show all its bytes (s): sshfs keeps a file's
#: attributes, its size included, for 20 s, and reads only up to the size it keeps
SEALED_WAIT_S = 30.0


def read_fresh(path: str | Path) -> bytes:
    """`path`'s bytes, written by another node of a shared log path, through two kinds of stale client cache:

    - a name looked up before it existed can stay absent for the client's negative timeout (GlusterFS's
      negative-timeout, NFS's lookupcache) while a listing of the folder shows it: on FileNotFoundError the
      folder is listed (which replaces the cached absence) and the file read once more;
    - a file another node replaced by rename can answer ESTALE through the entry this client still caches for
      the old one (GlusterFS, NFS): the folder is listed and the file read again, up to STALE_TRIES times
      within about 0.75 s; then OSError(ESTALE), which a reader that polls can take as "not now".

    FileNotFoundError when neither way finds it."""
    path = Path(path)
    for attempt in range(STALE_TRIES):
        try:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                try:
                    listed = path.name in os.listdir(path.parent)
                except FileNotFoundError:
                    listed = False
                if not listed:
                    raise
                return path.read_bytes()
        except OSError as exc:
            if exc.errno != errno.ESTALE or attempt == STALE_TRIES - 1:
                raise
            # the cached entry still names the replaced file: a listing of the folder refreshes the entries
            with contextlib.suppress(OSError):
                os.listdir(path.parent)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def make_dirs(path: Path) -> None:
    """`path.mkdir(parents=True, exist_ok=True)` where another node may make the same folders at once. On a
    distributed filesystem (GlusterFS seen here) a folder another client is creating can answer EEXIST to this
    client's mkdir while a mkdir inside it still answers ENOENT for a moment: list the folders on the way
    (which refreshes this client's entries) and try again, up to STALE_TRIES times within about 0.75 s. The same
    when a folder another client just made answers EEXIST to this client's mkdir while its cached absence makes
    Path.mkdir(exist_ok=True) take it for no folder (FileExistsError; 8 nodes starting at once)."""
    for attempt in range(STALE_TRIES):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except (FileNotFoundError, FileExistsError):
            if attempt == STALE_TRIES - 1:
                raise
            for folder in path.parents:
                with contextlib.suppress(OSError):
                    os.listdir(folder)
            time.sleep(0.05 * 2**attempt)


def exists_either_way(path: Path) -> bool:
    """`path` is seen by a listing of its folder or by its name: on some clients one way is seconds late, on
    others the other (coordinator.cluster.scan_ranks; docs/multinode.md "Filesystems")."""
    try:
        if path.name in os.listdir(path.parent):
            return True
    except FileNotFoundError:
        return False
    return path.exists()


def read_sealed(
    path: Path,
    size: int,
    sha256: str,
    wait_s: float | None = None,
    read: Callable[[Path], bytes] = read_fresh,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """The bytes of `path`, a file another node wrote and sealed at `size` bytes hashing to `sha256` (a journal:
    it only grows). A client that still keeps an older, shorter size reads a prefix: while fewer than `size`
    bytes come, read again every 0.5 s for up to `wait_s` (default SEALED_WAIT_S), listing the folder first.
    Returns what was read last; the caller compares it with the seal (b"" for a file not there)."""
    deadline = time.monotonic() + (SEALED_WAIT_S if wait_s is None else wait_s)
    while True:
        try:
            data = read(path)
        except FileNotFoundError:
            data = b""
        if len(data) >= size or hashlib.sha256(data).hexdigest() == sha256 or time.monotonic() >= deadline:
            return data
        with contextlib.suppress(OSError):
            os.listdir(path.parent)
        sleep(0.5)
