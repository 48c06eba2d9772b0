"""Atomic whole-file writes and journaled appends (docs/formats.md's rules).

    save_json(path, obj)          # temp file in the same directory, fsync, rename
    save_text(path, text)
    append_jsonl(path, obj)       # one O_APPEND write per line, then fsync
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def save_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; these files are shared with other nodes and users
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_json(path: str | Path, obj: Any) -> None:
    save_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def save_jsonl(path: str | Path, rows: list[Any]) -> None:
    save_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON line with a single write, then fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str | Path) -> None:
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
