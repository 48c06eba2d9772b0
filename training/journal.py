"""Load the trajectory journals of recent iterations (docs/formats.md).

    trajectories = load_trajectories(log_path, split="train", iterations=range(3, 7))

Reads `<log>/trajectories/<split>/iter_<NNNN>/rank_<r>.jsonl` with
`rollout_engine.journal.read_journal`: a torn line (a writer killed mid-line)
is skipped with a warning; a JSON line that is not a trajectory is a
`ConfigError` naming file and line. An episode written twice (a resumed
rollout) counts once: the last line wins. Relative image paths are made
absolute against the iteration directory. An iteration with the journals of
several ranks is read only once the master has merged it (its manifest.json
says every rank's journal is sealed complete and unchanged): ConfigError
otherwise. Pure Python: imports nothing heavy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from rollout_engine.errors import ConfigError
from rollout_engine.journal import read_journal
from rollout_engine.types import Trajectory

log = logging.getLogger(__name__)


def iteration_dir(log_path: str | Path, split: str, iteration: int) -> Path:
    """The journal directory of one iteration."""
    return Path(log_path) / "trajectories" / split / f"iter_{iteration:04d}"


def load_trajectories(log_path: str | Path, split: str, iterations: Iterable[int]) -> list[Trajectory]:
    """Every trajectory of the given iterations, oldest iteration first."""
    out: list[Trajectory] = []
    for iteration in sorted(set(iterations)):
        directory = iteration_dir(log_path, split, iteration)
        if not directory.is_dir():
            continue
        by_episode: dict[str, Trajectory] = {}
        paths = sorted(directory.glob("rank_*.jsonl"))
        if len(paths) > 1:
            check_merged(directory, len(paths))
        for path in paths:
            if not path.with_suffix(".manifest.json").exists():
                log.warning("%s has no manifest (rollout not sealed); reading it anyway", path)
            for trajectory in read_journal(path):
                _absolute_images(trajectory, directory)
                by_episode[trajectory.episode_id] = trajectory
        out.extend(by_episode.values())
    return out


def check_merged(directory: Path, journals: int) -> None:
    """An iteration rolled out by several ranks is trained on only once the master merged it: its
    manifest.json lists every rank's journal as sealed complete and unchanged since (coordinator.aggregate)."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise ConfigError(
            f"{directory} holds the journals of {journals} ranks but no manifest.json: the master writes it once "
            "every rank has sealed its journal; finish the multi-node rollout (--resume on every node) first"
        )
    manifest = json.loads(manifest_path.read_text())
    bad = [rank for rank, m in manifest.get("ranks", {}).items() if not (m and m.get("complete") and m.get("verified"))]
    if bad or not manifest.get("complete"):
        raise ConfigError(
            f"{manifest_path}: the journals of ranks {', '.join(bad) or '?'} are missing, incomplete or changed "
            "since they were sealed; finish the rollout with --resume on every node before training on it"
        )


def _absolute_images(trajectory: Trajectory, directory: Path) -> None:
    for turn in trajectory.turns:
        turn.images = [str(directory / p) if not Path(p).is_absolute() else p for p in turn.images]
