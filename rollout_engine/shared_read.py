"""The one way to read a small file another node of a shared log path wrote (docs/multinode.md "Filesystems").

    data = read_fresh(path)     # FileNotFoundError only when neither a listing nor the name finds it
    exists_either_way(path)     # a listing of its folder shows it, or its name does

Imports nothing of Baton's, so that every module can use it (rollout_engine.fence included).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

#: how many times a read that met a stale handle is tried again (each a fresh lookup of the name)
STALE_TRIES = 5


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


def exists_either_way(path: Path) -> bool:
    """`path` is seen by a listing of its folder or by its name: on some clients one way is seconds late, on
    others the other (coordinator.cluster.scan_ranks; docs/multinode.md "Filesystems")."""
    try:
        if path.name in os.listdir(path.parent):
            return True
    except FileNotFoundError:
        return False
    return path.exists()
