"""Durable file writes shared by every Baton module (docs/formats.md's rules).

    save_bytes(path, data)      # temp file in the same directory, fsync, rename, fsync dir
    save_text(path, text) / save_json(path, obj) / save_jsonl(path, rows)
    append_line(path, line)     # one O_APPEND write, then fsync (journals, metrics)
    append_jsonl(path, obj)

Readers see the old file or the whole new one, never a mix. Files are 0644:
the log path is shared with other nodes and users.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def save_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def save_text(path: str | Path, text: str) -> None:
    save_bytes(path, text.encode("utf-8"))


def save_json(path: str | Path, obj: Any) -> None:
    save_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def save_jsonl(path: str | Path, rows: list[Any]) -> None:
    save_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def append_line(path: str | Path, line: str) -> None:
    """Append one line with a single write, then fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_jsonl(path: str | Path, obj: Any) -> None:
    append_line(path, json.dumps(obj, ensure_ascii=False))


def fsync_dir(directory: str | Path) -> None:
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
