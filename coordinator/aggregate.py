"""The master's view of one multi-node rollout: every rank's journal, one manifest, one metrics record.

    python -m coordinator aggregate --log-path L --split train --iteration 3 --num-nodes 2 --wall-s 181

After a rollout barrier, the master reads `trajectories/<split>/iter_NNNN/rank_<r>.jsonl`
and `rank_<r>.manifest.json` of every rank and writes

- `trajectories/<split>/iter_NNNN/manifest.json`: the ranks' manifests (each with
  `verified`: the journal's sha256 is the one sealed), the episodes and planned episodes
  of all ranks, and `complete` (every rank's journal sealed complete and verified);
- one `"kind": "rollout"` record to `<log>/metrics.jsonl` with `rank: null` and
  `ranks: N`, computed from the union of the journals exactly as a single node computes
  its own (rollout_engine.metrics), with `wall_s` the phase's wall time and `per_rank`
  each rank's own record (from `<log>/metrics/rank_<r>.jsonl`, which only that rank writes).

Only the master appends to metrics.jsonl: appends from several NFS clients to one file
are not atomic.

With a takeover plan (`--takeover-plan`, written under --on-rank-failure continue by
coordinator.reassign), the iteration's data is the survivors' own journals, each dead rank's
journal up to its cut (the first `cut.lines` lines, verified against the cut's sha256: what it
appended later never counts) and every takeover journal `rank_<s>.takeover_<d>.jsonl`. The
manifest then also has `missing_ranks`, `cut`, `reassigned`, `takeovers`, `duplicates`,
`missing` and `unexpected`, and `complete` means every planned episode is in the data exactly
once (docs/formats.md). Without a plan (no rank was lost this time), the ranks' own journals are the
data; takeover journals left by an interrupted takeover (every node resumed, the dead rank finished its
own share) are listed under `superseded` with their dead rank and never counted, so each episode counts once.
"""

from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine import shared_read
from rollout_engine.errors import ConfigError
from rollout_engine.files import parse_jsonl, save_json
from rollout_engine.journal import load_manifest, read_journal
from rollout_engine.layout import (
    MERGED_MANIFEST,
    TAKEOVER_JOURNAL,
    Layout,
    journal_name,
    manifest_name,
    takeover_journal_name,
)
from rollout_engine.metrics import compute_metrics, save_metrics
from rollout_engine.shared_read import read_fresh, read_sealed
from rollout_engine.takeover import DeadRank, TakeoverPlan, load_takeover_plan, read_cut
from rollout_engine.types import Trajectory

PER_RANK_KEYS = ("episodes", "ok_episodes", "success_rate", "wall_s", "tokens_per_s", "complete", "policy_version")


def rank_metrics_path(log_path: Path, rank: int) -> Path:
    """Where a rank of a multi-node run writes its own rollout records."""
    return Layout(log_path).rank_metrics(rank)


def _rank_record(log_path: Path, rank: int, split: str, iteration: int, wait_s: float = 0.0) -> dict[str, Any] | None:
    """Rank `rank`'s own record of the rollout, read again every 0.5 s for up to `wait_s` while missing: a rank
    appends it after sealing its journal, and a client that keeps an older size of the file (sshfs: 20 s)
    reads it without its last lines."""
    path = rank_metrics_path(log_path, rank)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            rows = parse_jsonl(read_fresh(path)).rows
        except FileNotFoundError:
            rows = []
        found = [
            r
            for r in rows
            if isinstance(r, dict)
            and r.get("kind") == "rollout"
            and r.get("split") == split
            and r.get("iteration") == iteration
            and "takeover_of" not in r  # a takeover rollout's record: the rank's own is the one kept
        ]
        if found or time.monotonic() >= deadline:
            return found[-1] if found else None
        time.sleep(0.5)


def _verified_manifest(directory: Path, journal_name: str) -> dict[str, Any] | None:
    """A journal's sealed manifest with `verified`: the journal is byte for byte what was sealed (None if unsealed)."""
    manifest = load_manifest(directory / manifest_name(journal_name), strict=False)
    if manifest is not None:
        journal, sha = directory / journal_name, str(manifest.get("sha256"))
        if manifest.get("complete"):  # sealed on another node: this client may still keep a shorter size
            data = read_sealed(journal, int(manifest.get("bytes") or 0), sha)
        else:
            data = journal.read_bytes() if journal.exists() else b""
        manifest["verified"] = hashlib.sha256(data).hexdigest() == sha
    return manifest


def _sealed(manifest: dict[str, Any] | None) -> bool:
    return bool(manifest is not None and manifest.get("complete") and manifest["verified"])


@dataclass
class Merged:
    """One iteration's data as the master merged it."""

    trajectories: list[Trajectory]
    planned: int
    complete: bool
    #: the manifest's fields beyond the common ones (a takeover's: missing_ranks, cut, reassigned, ...)
    extra: dict[str, Any] = field(default_factory=dict)


def merge_ranks(directory: Path, manifests: dict[int, dict[str, Any] | None]) -> Merged:
    """Every rank's whole journal (an episode written twice counts once: the last line wins). Takeover journals
    left by an interrupted takeover (no rank was lost this time: every rank resumed its own share) are
    `superseded`: named in the manifest with their dead rank and never counted."""
    by_episode: dict[str, Trajectory] = {}
    for rank in manifests:
        for trajectory in read_journal(directory / journal_name(rank)):
            by_episode[trajectory.episode_id] = trajectory
    planned = sum(m.get("planned", 0) for m in manifests.values() if m)
    superseded = _superseded(directory, manifests)
    extra = {"superseded": superseded} if superseded else {}
    return Merged(list(by_episode.values()), planned, all(_sealed(m) for m in manifests.values()), extra)


def _superseded(directory: Path, manifests: dict[int, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """The takeover journals of `directory`, each with its dead rank, its episodes and why it is not counted."""
    found = {}
    for path in sorted(directory.glob("rank_*.takeover_*.jsonl")):
        match = TAKEOVER_JOURNAL.fullmatch(path.name)
        if match is None:
            continue
        dead = int(match.group(2))
        if dead not in manifests:
            reason = f"rank {dead} has no share in this merge"
        elif _sealed(manifests[dead]):
            reason = f"rank {dead}'s own journal is sealed complete"
        else:
            reason = f"rank {dead}'s own journal is not sealed complete: the iteration is incomplete"
        found[path.name] = {"rank": dead, "episodes": len(read_journal(path)), "reason": reason}
    return found


@dataclass
class TakeoverRead:
    """What `merge_takeover` gathers, journal by journal (the manifest's takeover fields)."""

    lines: list[Trajectory] = field(default_factory=list)
    #: the dead ranks' episodes: those in the cuts and those re-assigned
    expected: set[str] = field(default_factory=set)
    unexpected: set[str] = field(default_factory=set)
    #: every journal that must be sealed is, and unchanged; every cut is verified
    sealed: bool = True
    cut: dict[str, dict[str, Any]] = field(default_factory=dict)
    reassigned: dict[str, dict[str, int]] = field(default_factory=dict)
    takeovers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_cut(self, directory: Path, dead: int, entry: DeadRank) -> None:
        """The dead rank's journal up to its cut (verified: the prefix is the one cut)."""
        journal = directory / journal_name(dead)
        try:
            rows, verified = read_cut(journal, entry.cut.lines, entry.cut.sha256), True
        except ConfigError:
            rows, verified = [], False
        self.cut[str(dead)] = {
            "journal": journal.name,
            "lines": entry.cut.lines,
            "sha256": entry.cut.sha256,
            "episodes": len(rows),
            "verified": verified,
        }
        self.sealed = self.sealed and verified
        self.lines += rows
        self.expected |= set(entry.cut.episode_ids)

    def add_takeover(self, directory: Path, dead: int, survivor: int, assigned: list[str]) -> None:
        """Survivor's journal of the dead rank's episodes: sealed and verified unless nothing was assigned."""
        name = takeover_journal_name(survivor, dead)
        manifest = _verified_manifest(directory, name)
        self.takeovers.setdefault(str(dead), {})[str(survivor)] = manifest
        self.reassigned.setdefault(str(dead), {})[str(survivor)] = len(assigned)
        self.sealed = self.sealed and (not assigned or _sealed(manifest))
        rows = read_journal(directory / name)
        self.unexpected |= {t.episode_id for t in rows} - set(assigned)
        self.lines += rows
        self.expected |= set(assigned)


def merge_takeover(directory: Path, manifests: dict[int, dict[str, Any] | None], plan: TakeoverPlan) -> Merged:
    """The survivors' journals, each dead rank's cut and every takeover journal; complete when every
    journal is sealed and verified and every planned episode is in the data exactly once."""
    read = TakeoverRead(sealed=all(_sealed(m) for rank, m in manifests.items() if rank not in plan.dead))
    for rank in (rank for rank in manifests if rank not in plan.dead):
        read.lines += read_journal(directory / journal_name(rank))
    for dead, entry in sorted(plan.dead.items()):
        read.add_cut(directory, dead, entry)
        for survivor, assigned in sorted(entry.assignments.items()):
            read.add_takeover(directory, dead, survivor, assigned)
    counts = collections.Counter(t.episode_id for t in read.lines)
    duplicates = sorted(episode_id for episode_id, n in counts.items() if n > 1)
    missing = sorted(read.expected - counts.keys())
    planned = sum(m.get("planned", 0) for rank, m in manifests.items() if m and rank not in plan.dead)
    planned += sum(entry.planned for entry in plan.dead.values())
    extra = {
        "missing_ranks": sorted(plan.dead),
        "cut": read.cut,
        "reassigned": read.reassigned,
        "takeovers": read.takeovers,
        "duplicates": duplicates,
        "missing": missing,
        "unexpected": sorted(read.unexpected),
    }
    complete = read.sealed and not (duplicates or missing or read.unexpected)
    return Merged(list({t.episode_id: t for t in read.lines}.values()), planned, complete, extra)


def aggregate(
    log_path: Path,
    split: str,
    iteration: int,
    num_nodes: int,
    wall_s: float,
    takeover_plan: Path | None = None,
    ranks: list[int] | None = None,
) -> dict[str, Any]:
    """Write the iteration's manifest and append the merged metrics record; return the record.

    With `takeover_plan` (a takeover.json), the dead ranks' data is their journal up to the cut plus the
    survivors' takeover journals (merge_takeover); ConfigError when the plan is missing or bad. `ranks`: the
    ranks with a share in this step (default: all; a continue run's step leaves out the ranks not in it).
    """
    directory = Layout(log_path).iteration_dir(split, iteration)
    ranks = list(range(num_nodes)) if ranks is None else ranks
    manifests = {rank: _verified_manifest(directory, journal_name(rank)) for rank in ranks}
    if takeover_plan is None:
        merged = merge_ranks(directory, manifests)
    else:
        merged = merge_takeover(directory, manifests, load_takeover_plan(takeover_plan, "--takeover-plan"))
    planned, trajectories = merged.planned, merged.trajectories
    save_json(
        directory / MERGED_MANIFEST,
        {
            "split": split,
            "iteration": iteration,
            "ranks": {str(rank): m for rank, m in manifests.items()},
            "episodes": len(trajectories),
            "planned": planned,
            "complete": merged.complete,
            **merged.extra,
        },
    )
    record = compute_metrics(trajectories, wall_s, planned, cancelled=max(planned - len(trajectories), 0))
    per_rank = {}
    for rank in ranks:
        sealed = _sealed(manifests.get(rank))  # a rank that sealed its journal complete has appended its record
        own = _rank_record(log_path, rank, split, iteration, shared_read.SEALED_WAIT_S if sealed else 0.0)
        per_rank[str(rank)] = {k: own.get(k) for k in PER_RANK_KEYS} if own else None
    versions = {r["policy_version"] for r in per_rank.values() if r}
    record.update(
        split=split,
        iteration=iteration,
        rank=None,
        ranks=num_nodes,
        complete=merged.complete,
        policy_version=versions.pop() if len(versions) == 1 else None,
        per_rank=per_rank,
    )
    if takeover_plan is not None:
        record.update(missing_ranks=merged.extra["missing_ranks"], reassigned=merged.extra["reassigned"])
    save_metrics(Layout(log_path).metrics, record)
    return record
