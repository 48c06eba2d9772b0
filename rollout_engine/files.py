"""Atomic whole-file writes (temp file in the same directory, fsync, rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def save_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_json_atomic(path: Path, obj: Any) -> None:
    save_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def append_line_durable(path: Path, line: str) -> None:
    """Append one line and fsync it (journals and metrics are append-only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line if line.endswith("\n") else line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
