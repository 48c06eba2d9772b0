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

An iteration a dead rank's survivors finished (--on-rank-failure continue, being
wired: its manifest.json has `missing_ranks`) is read exactly as the manifest
says: the survivors' journals, each dead rank's journal up to its cut (the
first `cut.lines` lines, checked against the cut's sha256; what it appended
later is never read) and the takeover journals `rank_<s>.takeover_<d>.jsonl`,
and only when the manifest says every planned episode is there exactly once.
Takeover journals the manifest names `superseded` (an interrupted takeover whose
dead rank, resumed, finished its own share) are never read.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollout_engine import shared_read
from rollout_engine.errors import ConfigError
from rollout_engine.journal import load_manifest, parse_journal, read_journal
from rollout_engine.layout import (
    MERGED_MANIFEST,
    Layout,
    journal_name,
    manifest_name,
    parse_journal_name,
    takeover_journal_name,
)
from rollout_engine.shared_read import read_sealed
from rollout_engine.takeover import read_cut
from rollout_engine.types import Trajectory

log = logging.getLogger(__name__)


def load_trajectories(log_path: str | Path, split: str, iterations: Iterable[int]) -> list[Trajectory]:
    """Every trajectory of the given iterations, oldest iteration first."""
    out: list[Trajectory] = []
    for iteration in sorted(set(iterations)):
        directory = Layout(log_path).iteration_dir(split, iteration)
        if not directory.is_dir():
            continue
        by_episode: dict[str, Trajectory] = {}
        for trajectory in read_iteration(directory):
            _absolute_images(trajectory, directory)
            by_episode[trajectory.episode_id] = trajectory
        out.extend(by_episode.values())
    return out


def read_iteration(directory: Path) -> list[Trajectory]:
    """The trajectories of one iteration directory, journal by journal, as its manifest.json says to read them."""
    journals = {p.name: parse_journal_name(p.name) for p in directory.glob("rank_*.jsonl")}
    names = sorted(name for name, parsed in journals.items() if parsed is not None)
    own = [name for name in names if journals[name][1] is None]
    manifest_path = directory / MERGED_MANIFEST
    manifest = load_manifest(manifest_path)
    if manifest is not None and "missing_ranks" in manifest:
        check_takeover_merged(manifest_path, manifest)
        return read_takeover(directory, manifest)
    # every rank's journal the master merged, by name: a listing on a shared filesystem can lack a file another
    # node wrote (sshfs lists a folder up to 20 s late)
    merged = [journal_name(int(rank)) for rank in (manifest or {}).get("ranks", {})]
    own = sorted(set(own) | set(merged))
    superseded = manifest.get("superseded", {}) if manifest is not None else {}
    takeovers = [name for name in names if journals[name][1] is not None and name not in superseded]
    if takeovers:
        raise ConfigError(
            f"{directory} holds takeover journals ({', '.join(takeovers)}) but no manifest.json that merged them: "
            "the master writes it with the takeover plan once the survivors sealed them; finish the takeover, or "
            "move those journals aside if the dead rank finished its own share after all"
        )
    if len(own) > 1:
        check_merged(directory, len(own))
    seals = (manifest or {}).get("ranks", {})
    out: list[Trajectory] = []
    for path in (directory / name for name in own):
        parsed = parse_journal_name(path.name)
        seal = seals.get(str(parsed[0])) if parsed is not None else None
        if seal and seal.get("sha256"):
            out += parse_journal(_sealed_bytes(path, seal), path)
            continue
        if not path.with_name(manifest_name(path.name)).exists():
            log.warning("%s has no manifest (rollout not sealed); reading it anyway", path)
        out += read_journal(path)
    return out


def _sealed_bytes(path: Path, seal: dict[str, Any]) -> bytes:
    """The journal as the master merged it (another node's, read through this node's client), or ConfigError."""
    size, sha = int(seal.get("bytes") or 0), str(seal["sha256"])
    data = read_sealed(path, size, sha)
    if hashlib.sha256(data).hexdigest() != sha:
        raise ConfigError(
            f"{path} is not the journal the master merged ({len(data)} bytes read, {size} sealed, another sha256): "
            f"it changed since, or this node's filesystem client still showed an older copy after "
            f"{shared_read.SEALED_WAIT_S:.0f} s; merge the iteration again (--resume on every node)"
        )
    return data


def read_takeover(directory: Path, manifest: dict[str, Any]) -> list[Trajectory]:
    """A taken-over iteration: each rank's journal (a dead rank's up to its cut), then the takeover journals."""
    dead = {int(rank) for rank in manifest["missing_ranks"]}
    out: list[Trajectory] = []
    for rank in sorted(int(r) for r in manifest["ranks"]):
        if rank in dead:
            cut = manifest["cut"][str(rank)]
            out += read_cut(directory / cut["journal"], int(cut["lines"]), str(cut["sha256"]))
        else:
            out += read_journal(directory / journal_name(rank))
    for dead_rank, survivors in sorted(manifest["takeovers"].items(), key=lambda item: int(item[0])):
        for survivor in sorted(survivors, key=int):
            out += read_journal(directory / takeover_journal_name(int(survivor), int(dead_rank)))
    return out


def check_takeover_merged(manifest_path: Path, manifest: dict[str, Any]) -> None:
    """A taken-over iteration is trained on only when its manifest says every planned episode is there once."""
    if manifest.get("complete"):
        return
    dead = {str(rank) for rank in manifest.get("missing_ranks", [])}
    problems = [f"rank {r}'s journal" for r, m in manifest.get("ranks", {}).items() if r not in dead and not _sealed(m)]
    problems += [f"rank {r}'s journal up to its cut" for r, c in manifest.get("cut", {}).items() if not c["verified"]]
    for d, survivors in manifest.get("takeovers", {}).items():
        counts = manifest.get("reassigned", {}).get(d, {})
        problems += [
            takeover_journal_name(int(s), int(d)) for s, m in survivors.items() if counts.get(s, 1) and not _sealed(m)
        ]
    for key in ("duplicates", "missing", "unexpected"):
        if manifest.get(key):
            problems.append(f"{key} episodes {', '.join(manifest[key][:5])}{' ...' if len(manifest[key]) > 5 else ''}")
    raise ConfigError(
        f"{manifest_path}: the takeover of ranks {', '.join(sorted(dead))} is not complete "
        f"({'; '.join(problems) or 'see the manifest'}: missing, incomplete, changed or not exactly once); "
        "finish the takeover rollouts and merge the iteration again before training on it"
    )


def _sealed(manifest: dict[str, Any] | None) -> bool:
    return bool(manifest and manifest.get("complete") and manifest.get("verified"))


def check_merged(directory: Path, journals: int) -> None:
    """An iteration rolled out by several ranks is trained on only once the master merged it: its
    manifest.json lists every rank's journal as sealed complete and unchanged since (coordinator.aggregate)."""
    manifest_path = directory / MERGED_MANIFEST
    if not manifest_path.exists():
        raise ConfigError(
            f"{directory} holds the journals of {journals} ranks but no manifest.json: the master writes it once "
            "every rank has sealed its journal; finish the multi-node rollout first: run it again with --resume "
            "on every node"
        )
    manifest = load_manifest(manifest_path) or {}
    bad = [rank for rank, m in manifest.get("ranks", {}).items() if not (m and m.get("complete") and m.get("verified"))]
    if bad or not manifest.get("complete"):
        raise ConfigError(
            f"{manifest_path}: the journals of ranks {', '.join(bad) or '?'} are missing, incomplete or changed "
            "since they were sealed; finish the rollout with --resume on every node before training on it"
        )


def _absolute_images(trajectory: Trajectory, directory: Path) -> None:
    for turn in trajectory.turns:
        turn.images = [str(directory / p) if not Path(p).is_absolute() else p for p in turn.images]
