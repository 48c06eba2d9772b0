"""The per-rank journal of one rollout: append-only JSON lines, sealed by a manifest.

`<log>/trajectories/<split>/iter_<NNNN>/rank_<r>.jsonl` holds one finished
trajectory per line (schema in docs/formats.md), each line flushed and fsynced
as the episode finishes, through a descriptor kept open until the seal
(`rollout_engine.files.LineAppender`: two calls a line on the shared
filesystem). A line cut short by a crash (not JSON) is skipped on read
(`rollout_engine.files.read_jsonl`'s rule), and a torn last line is cut off
before a resume appends again; a JSON line that is not a trajectory is
corruption and an error.
`rank_<r>.manifest.json` is written atomically when the rollout ends: counts
by status, the journal's sha256 and byte size, and whether every planned
episode is in it (`complete`). `load_manifest` is the one reader of it and
of the master's merge of several ranks' manifests (`manifest.json`).

Opening without resume never overwrites: an existing journal (and manifest) is
renamed to `rank_<r>.jsonl.aside-<UTC time>` with a warning. Opening with resume
keeps it (removing a stale manifest) and reports which episodes are done.
Cancelled episodes are never journaled, so resume runs them again.

The rollout writes through `await journal.write(t)`: the line is written in a
worker thread and a cancellation that arrives meanwhile waits for that write
before it propagates, so `seal` (which refuses to run while a write is in
flight) reads a file that nothing is still appending to.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.files import LineAppender, parse_jsonl, save_json
from rollout_engine.layout import manifest_name
from rollout_engine.shared_read import make_dirs, read_fresh
from rollout_engine.types import Trajectory

logger = logging.getLogger(__name__)

MANIFEST_SCHEMA = "baton.manifest/1"


def read_journal(path: Path) -> list[Trajectory]:
    """The journal's trajectories; torn lines (not JSON) are skipped with a warning.

    A line that is JSON but not a trajectory is corruption: ConfigError naming file and line.
    """
    if not path.exists():
        return []
    return parse_journal(path.read_bytes(), path)


def parse_journal(data: bytes, path: Path) -> list[Trajectory]:
    """`read_journal` of bytes already read from `path` (a journal's prefix: rollout_engine.takeover)."""
    read = parse_jsonl(data)
    if read.torn:
        logger.warning("journal %s: skipping torn lines %s (writes cut short by a crash)", path, read.torn)
    trajectories = []
    for number, row in zip(read.numbers, read.rows, strict=True):
        trajectories.append(trajectory_of(row, f"journal {path}:{number}", "move the file aside or fix the line"))
    return trajectories


def trajectory_of(row: Any, where: str, fix: str) -> Trajectory:
    """`Trajectory.from_json(row)`, or one ConfigError: `<where> is not a baton.trajectory/1 line (<why>); <fix>`."""
    try:
        return Trajectory.from_json(row)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        if not isinstance(row, dict):
            why = f"a JSON {type(row).__name__}, not an object"
        raise ConfigError(f"{where} is not a baton.trajectory/1 line ({why}); {fix}") from None


def load_manifest(path: Path, *, strict: bool = True) -> dict[str, Any] | None:
    """A journal's sealed manifest or an iteration's merged `manifest.json`; None when there is none. One that
    is not a JSON object is a ConfigError naming it (`strict`), else None (for readers that show or re-check)."""
    try:
        text = read_fresh(path).decode(errors="replace")
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError:
        manifest = None
    if isinstance(manifest, dict):
        return manifest
    if not strict:
        return None
    raise ConfigError(
        f"{path} is not a JSON object (got {text.strip()[:80]!r}); move it aside and merge the iteration "
        "again (the master rewrites it: --resume)"
    )


def drop_torn_tail(path: Path) -> None:
    """Cut a torn last line (bytes after the last newline) off `path`, so a resumed journal is clean."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        data = handle.read()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


class Journal:
    """Append-only writer of one rank's trajectories for one (split, iteration)."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.manifest_path = path.with_name(manifest_name(path.name))
        self.done: list[Trajectory] = []
        self._writes: set[asyncio.Future] = set()
        self._appender = LineAppender(path)
        make_dirs(path.parent)
        if resume:
            self.done = read_journal(path)
            drop_torn_tail(path)
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
        self._appender.append(json.dumps(trajectory.to_json(), ensure_ascii=False))

    async def write(self, trajectory: Trajectory) -> None:
        """Append `trajectory` in a worker thread; once started, the write always finishes.

        A cancellation that arrives during the write waits for it to end, then
        propagates: the line is in the file and the caller must count it.
        """
        write = asyncio.ensure_future(asyncio.to_thread(self.append, trajectory))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        cancelled: asyncio.CancelledError | None = None
        while not write.done():
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
        write.result()  # the write's own error (OSError) wins over the cancellation
        if cancelled is not None:
            raise cancelled

    def seal(self, planned: int) -> dict:
        """Write the manifest atomically; returns it. Refuses while a `write` is in flight."""
        if self._writes:
            raise RuntimeError(f"journal {self.path}: seal() while {len(self._writes)} write(s) are in flight")
        self._appender.close()
        trajectories = read_journal(self.path)
        data = self.path.read_bytes() if self.path.exists() else b""
        ids = {t.episode_id for t in trajectories}
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "journal": self.path.name,
            "episodes": len(trajectories),
            "planned": planned,
            "complete": len(ids) >= planned,
            "by_status": dict(collections.Counter(t.status.value for t in trajectories)),
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "sealed_at": time.time(),
        }
        save_json(self.manifest_path, manifest)
        return manifest


class JournalRouter:
    """Several journals behind one `write`: each trajectory goes to the journal that plans its episode.

    A takeover rollout journals each dead rank's episodes apart (rollout_engine.takeover); a rank's own
    rollout routes every episode to its one journal.
    """

    def __init__(self, routes: dict[str, Journal]) -> None:
        #: episode id -> the journal it is written to
        self.routes = routes

    async def write(self, trajectory: Trajectory) -> None:
        await self.routes[trajectory.episode_id].write(trajectory)
