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
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rollout_engine.files import read_jsonl, save_json
from rollout_engine.journal import read_journal
from rollout_engine.metrics import compute_metrics, save_metrics
from rollout_engine.types import Trajectory

PER_RANK_KEYS = ("episodes", "ok_episodes", "success_rate", "wall_s", "tokens_per_s", "complete", "policy_version")


def rank_metrics_path(log_path: Path, rank: int) -> Path:
    """Where a rank of a multi-node run writes its own rollout records."""
    return Path(log_path) / "metrics" / f"rank_{rank}.jsonl"


def _rank_record(log_path: Path, rank: int, split: str, iteration: int) -> dict[str, Any] | None:
    path = rank_metrics_path(log_path, rank)
    rows = read_jsonl(path).rows if path.exists() else []
    found = [
        r for r in rows if r.get("kind") == "rollout" and r.get("split") == split and r.get("iteration") == iteration
    ]
    return found[-1] if found else None


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def aggregate(log_path: Path, split: str, iteration: int, num_nodes: int, wall_s: float) -> dict[str, Any]:
    """Write the iteration's manifest and append the merged metrics record; return the record."""
    directory = Path(log_path) / "trajectories" / split / f"iter_{iteration:04d}"
    manifests = {rank: _manifest(directory / f"rank_{rank}.manifest.json") for rank in range(num_nodes)}
    for rank, manifest in manifests.items():
        if manifest is not None:  # the journal is byte for byte what the rank sealed
            journal = directory / f"rank_{rank}.jsonl"
            data = journal.read_bytes() if journal.exists() else b""
            manifest["verified"] = hashlib.sha256(data).hexdigest() == manifest.get("sha256")
    by_episode: dict[str, Trajectory] = {}
    for rank in range(num_nodes):
        for trajectory in read_journal(directory / f"rank_{rank}.jsonl"):
            by_episode[trajectory.episode_id] = trajectory
    planned = sum(m.get("planned", 0) for m in manifests.values() if m)
    complete = all(m is not None and m.get("complete") and m["verified"] for m in manifests.values())
    save_json(
        directory / "manifest.json",
        {
            "split": split,
            "iteration": iteration,
            "ranks": {str(rank): m for rank, m in manifests.items()},
            "episodes": len(by_episode),
            "planned": planned,
            "complete": complete,
        },
    )
    trajectories = list(by_episode.values())
    record = compute_metrics(trajectories, wall_s, planned, cancelled=max(planned - len(trajectories), 0))
    per_rank = {}
    for rank in range(num_nodes):
        own = _rank_record(log_path, rank, split, iteration)
        per_rank[str(rank)] = {k: own.get(k) for k in PER_RANK_KEYS} if own else None
    versions = {r["policy_version"] for r in per_rank.values() if r}
    record.update(
        split=split,
        iteration=iteration,
        rank=None,
        ranks=num_nodes,
        complete=complete,
        policy_version=versions.pop() if len(versions) == 1 else None,
        per_rank=per_rank,
    )
    save_metrics(Path(log_path) / "metrics.jsonl", record)
    return record
