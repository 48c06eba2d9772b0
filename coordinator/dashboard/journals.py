"""Episodes of one rollout read from its journals: grid cells and one episode's turns.

    book = Journals(log_path)
    book.rollouts()                          # [(split, iteration)] that have a trajectories/ directory
    book.cells("train", 3)                   # {rank: [cell]}: one cell per journaled episode
    book.episode("train", 3, "rg-0042#1")    # the trajectory (turns, with image paths), or None

A journal is re-read only when its size or modification time changed, so the
page can poll a long run's journals cheaply. Image paths in turns are relative
to the iteration's directory (rollout_engine/context.py `images_dir`); they are
returned relative to the log path, which is what the server serves.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_engine.files import read_jsonl
from rollout_engine.layout import Layout, iterations, parse_journal_name

#: token ids and their log-probabilities are long and of no use to a person reading an episode
_HEAVY = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


@dataclass
class _Cached:
    key: tuple[int, int]  # (inode, size) of the file when read
    rows: list[dict[str, Any]]


def cell_of(row: dict[str, Any]) -> dict[str, Any]:
    """A journaled episode as a grid cell (the fields of status.json's cells)."""
    return {
        "episode_id": row.get("episode_id"),
        "state": "done" if row.get("status") == "ok" else "failed",
        "step": len(row.get("turns") or []),
        "success": bool(row.get("success")),
        "reward": row.get("reward"),
        "status": row.get("status"),
    }


class Journals:
    """Reads `trajectories/<split>/iter_<NNNN>/rank_<r>*.jsonl` under one log path, with a small cache."""

    def __init__(self, log: Path) -> None:
        self.log = Path(log)
        self.layout = Layout(self.log)
        self._cache: dict[Path, _Cached] = {}
        self._lock = threading.Lock()

    def rollouts(self) -> list[tuple[str, int]]:
        found = []
        for split in ("train", "test"):
            found += [(split, n) for n, path in iterations(self.layout.trajectories(split)) if path.is_dir()]
        return sorted(found, key=lambda s: (s[1], s[0]))

    def journals(self, split: str, iteration: int) -> list[tuple[int, Path]]:
        directory = self.layout.iteration_dir(split, iteration)
        found = []
        for path in sorted(directory.glob("rank_*.jsonl")) if directory.is_dir() else []:
            parsed = parse_journal_name(path.name)
            if parsed:
                found.append((parsed[0], path))
        return found

    def rows(self, path: Path) -> list[dict[str, Any]]:
        """The journal's trajectories (torn lines skipped), from the cache while the file is unchanged."""
        try:
            stat = path.stat()
        except OSError:
            return []
        # a journal only grows, and one moved aside on a restart is followed by a new file: no mtime, which a
        # network filesystem's client may show late or in whole seconds
        key = (stat.st_ino, stat.st_size)
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached.key == key:
                return cached.rows
        rows = [r for r in read_jsonl(path).rows if isinstance(r, dict)]
        with self._lock:
            self._cache[path] = _Cached(key, rows)
        return rows

    def cells(self, split: str, iteration: int) -> dict[int, list[dict[str, Any]]]:
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for rank, path in self.journals(split, iteration):
            by_rank.setdefault(rank, []).extend(cell_of(r) for r in self.rows(path))
        return by_rank

    def episode(self, split: str, iteration: int, episode_id: str) -> dict[str, Any] | None:
        """The episode's trajectory for a person: token ids left out, image paths relative to the log path."""
        prefix = self.layout.iteration_dir(split, iteration).relative_to(self.log).as_posix()
        for _, path in self.journals(split, iteration):
            for row in self.rows(path):
                if row.get("episode_id") != episode_id:
                    continue
                turns = []
                for turn in row.get("turns") or []:
                    light = {k: v for k, v in turn.items() if k not in _HEAVY}
                    light["images"] = [f"{prefix}/{image}" for image in turn.get("images") or []]
                    turns.append(light)
                return {**row, "turns": turns, "journal": path.relative_to(self.log).as_posix()}
        return None
