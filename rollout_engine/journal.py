"""The per-rank journal of one rollout: append-only JSON lines, sealed by a manifest.

`<log>/trajectories/<split>/iter_<NNNN>/rank_<r>.jsonl` holds one finished
trajectory per line (schema in docs/formats.md), each line flushed and fsynced
as the episode finishes. A line cut short by a crash (the last line, without
its newline or not parseable) is dropped on read and truncated away before
appending again; a bad line anywhere else is corruption and an error.
`rank_<r>.manifest.json` is written atomically when the rollout ends: counts
by status, the journal's sha256 and byte size, and whether every planned
episode is in it (`complete`).

Opening without resume never overwrites: an existing journal (and manifest) is
renamed to `rank_<r>.jsonl.aside-<UTC time>` with a warning. Opening with resume
keeps it (removing a stale manifest) and reports which episodes are done.
Cancelled episodes are never journaled, so resume runs them again.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import time
from pathlib import Path

from rollout_engine.errors import ConfigError
from rollout_engine.files import append_line, save_json
from rollout_engine.types import Trajectory

logger = logging.getLogger(__name__)

MANIFEST_SCHEMA = "baton.manifest/1"


def read_journal(path: Path) -> tuple[list[Trajectory], int]:
    """The journal's trajectories and the byte length of its intact part (a torn last line is left out)."""
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    lines = data.split(b"\n")
    trajectories: list[Trajectory] = []
    good = 0
    for number, raw in enumerate(lines, start=1):
        is_last = number == len(lines)
        if is_last and raw == b"":
            break
        try:
            if is_last:
                raise ValueError("no newline at the end")
            trajectories.append(Trajectory.from_json(json.loads(raw)))
        except (ValueError, KeyError, TypeError) as exc:
            if number >= len(lines) - 1 and (is_last or lines[-1] == b""):
                logger.warning("journal %s: dropping a torn last line (%d bytes): %s", path, len(raw), exc)
                break
            raise ConfigError(
                f"journal {path}:{number} is corrupt ({exc}); move the file aside or fix that line"
            ) from None
        good += len(raw) + 1
    return trajectories, good


class Journal:
    """Append-only writer of one rank's trajectories for one (split, iteration)."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.manifest_path = path.with_name(path.name.replace(".jsonl", ".manifest.json"))
        self.done: list[Trajectory] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume:
            self.done, good = read_journal(path)
            if path.exists() and path.stat().st_size != good:
                os.truncate(path, good)
            self.manifest_path.unlink(missing_ok=True)
            if self.done:
                logger.info("resume: %d episodes already in %s are skipped", len(self.done), path)
        elif path.exists() or self.manifest_path.exists():
            self._move_aside()

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for old in (self.path, self.manifest_path):
            if old.exists():
                target = old.with_name(f"{old.name}.aside-{stamp}")
                os.replace(old, target)
                logger.warning(
                    "%s exists and resume=false: moved it to %s (pass resume=true to continue it)", old, target
                )

    @property
    def done_ids(self) -> set[str]:
        return {t.episode_id for t in self.done}

    def append(self, trajectory: Trajectory) -> None:
        append_line(self.path, json.dumps(trajectory.to_json(), ensure_ascii=False))

    def seal(self, planned: int) -> dict:
        """Write the manifest atomically; returns it."""
        trajectories, size = read_journal(self.path)
        digest = hashlib.sha256(self.path.read_bytes()[:size] if self.path.exists() else b"").hexdigest()
        ids = {t.episode_id for t in trajectories}
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "journal": self.path.name,
            "episodes": len(trajectories),
            "planned": planned,
            "complete": len(ids) >= planned,
            "by_status": dict(collections.Counter(t.status.value for t in trajectories)),
            "sha256": digest,
            "bytes": size,
            "sealed_at": time.time(),
        }
        save_json(self.manifest_path, manifest)
        return manifest
