"""A dead rank's episodes taken over by the survivors: the takeover plan, the cut of the dead rank's journal.

Used by --on-rank-failure continue: the driver's takeover (coordinator/driver/rollout.py) passes the plan.

    cut = cut_journal(directory / "rank_1.jsonl")          # the complete lines the dead rank journaled
    plan = TakeoverPlan("train", 3, [1, 1, 1], {1: DeadRank(cut, planned=16, assignments={0: [...], 2: [...]})})
    save_takeover_plan(takeover_plan_path(directory), plan)
    plan = load_takeover_plan(path, "takeover_plan")      # ConfigError naming the field when it is bad
    rows = read_cut(directory / "rank_1.jsonl", cut.lines, cut.sha256)   # the prefix, verified

When the master declares a rank dead mid-rollout (coordinator.cluster's eviction), it cuts the
dead rank's journal `rank_<d>.jsonl`: the cut is the file's complete lines at that moment (a torn
last line, bytes after the last newline, is not in it), counted and hashed (sha256 of the prefix's
bytes). The episodes journaled in the cut stay the dead rank's; its other planned episodes are
re-assigned to the survivors (coordinator.reassign) and written to
`trajectories/<split>/iter_NNNN/takeover.json`. A survivor rolls out its assigned episodes
(`rollout_engine.runner`, `takeover_plan=...`) into `rank_<s>.takeover_<d>.jsonl`, sealed like any
journal. Whatever the dead rank appends after the cut is never read: `read_cut` takes the first
`lines` lines only, and refuses a prefix whose sha256 is not the cut's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_engine.errors import ConfigError
from rollout_engine.files import save_json
from rollout_engine.journal import parse_journal
from rollout_engine.layout import TAKEOVER_PLAN, journal_name
from rollout_engine.types import Trajectory

if TYPE_CHECKING:  # training reads takeovers too and stays free of omegaconf
    from rollout_engine.config import RolloutConfig
    from rollout_engine.types import EpisodeSpec

TAKEOVER_SCHEMA = "baton.takeover/1"
NEWLINE = b"\n"


def takeover_plan_path(directory: Path) -> Path:
    """`takeover.json` of one iteration directory (trajectories/<split>/iter_NNNN/)."""
    return Path(directory) / TAKEOVER_PLAN


def takeover_plan_file(cfg: RolloutConfig) -> Path:
    """The rollout's `takeover_plan` as a path (relative paths are under log_path)."""
    path = Path(cfg.takeover_plan)
    return path if path.is_absolute() else Path(cfg.log_path) / path


@dataclass(frozen=True)
class Cut:
    """Where a dead rank's journal was cut: its first `lines` lines (bytes up to the last newline)."""

    lines: int
    #: the ids of the trajectories in those lines, in file order (torn lines hold none)
    episode_ids: tuple[str, ...]
    #: sha256 of the prefix's bytes
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"lines": self.lines, "sha256": self.sha256, "episode_ids": list(self.episode_ids)}


@dataclass
class DeadRank:
    """One dead rank of the plan: its cut, how many episodes it planned, who takes over the rest."""

    cut: Cut
    planned: int
    #: survivor rank -> the dead rank's episode ids it rolls out, in the dead rank's planned order
    assignments: dict[int, list[str]] = field(default_factory=dict)


@dataclass
class TakeoverPlan:
    """takeover.json: for one (split, iteration), every dead rank's cut and re-assigned episodes."""

    split: str
    iteration: int
    rank_weights: list[float]
    dead: dict[int, DeadRank]

    def assigned_to(self, rank: int) -> dict[int, list[str]]:
        """Dead rank -> the episode ids `rank` takes over (only dead ranks whose plan names `rank`)."""
        return {d: entry.assignments[rank] for d, entry in sorted(self.dead.items()) if rank in entry.assignments}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": TAKEOVER_SCHEMA,
            "split": self.split,
            "iteration": self.iteration,
            "rank_weights": list(self.rank_weights),
            "dead": {
                str(d): {
                    "journal": journal_name(d),
                    "cut": entry.cut.to_json(),
                    "planned": entry.planned,
                    "assignments": {str(s): list(ids) for s, ids in sorted(entry.assignments.items())},
                }
                for d, entry in sorted(self.dead.items())
            },
        }


def _prefix(data: bytes, lines: int) -> bytes | None:
    """The first `lines` newline-terminated lines of `data`, or None when it has fewer."""
    end = 0
    for _ in range(lines):
        found = data.find(NEWLINE, end)
        if found < 0:
            return None
        end = found + 1
    return data[:end]


def cut_journal(path: Path) -> Cut:
    """Cut `path` where it stands: its complete lines (a torn last line is not one), their ids and sha256."""
    data = path.read_bytes() if path.exists() else b""
    prefix = data[: data.rfind(NEWLINE) + 1]
    trajectories = parse_journal(prefix, path)
    return Cut(prefix.count(NEWLINE), tuple(t.episode_id for t in trajectories), hashlib.sha256(prefix).hexdigest())


def read_cut(path: Path, lines: int, sha256: str) -> list[Trajectory]:
    """The trajectories of the first `lines` lines of `path` (the one torn-line rule applies inside them).

    ConfigError when the file has fewer complete lines or the prefix's sha256 is not `sha256`: the
    journal was changed before its cut, so the cut no longer says what the dead rank journaled.
    """
    data = path.read_bytes() if path.exists() else b""
    prefix = _prefix(data, lines)
    if prefix is None:
        raise ConfigError(
            f"journal {path} has {data.count(NEWLINE)} complete lines, fewer than its cut ({lines}); it was truncated "
            "or replaced after the master cut it: restore it, or roll the iteration out again"
        )
    if hashlib.sha256(prefix).hexdigest() != sha256:
        raise ConfigError(
            f"journal {path}: its first {lines} lines are not the ones the master cut (sha256 differs); it was "
            "changed after the cut: restore it, or roll the iteration out again"
        )
    return parse_journal(prefix, path)


def save_takeover_plan(path: Path, plan: TakeoverPlan) -> None:
    """Write `plan` atomically (temp file, fsync, rename)."""
    save_json(path, plan.to_json())


def _dead_rank(row: Any) -> DeadRank:
    cut = row["cut"]
    assignments = {int(s): [str(i) for i in ids] for s, ids in row["assignments"].items()}
    return DeadRank(
        Cut(int(cut["lines"]), tuple(str(i) for i in cut["episode_ids"]), str(cut["sha256"])),
        int(row["planned"]),
        assignments,
    )


def load_takeover_plan(path: Path, field_name: str) -> TakeoverPlan:
    """The plan in `path`; ConfigError naming `field_name`, the path and the fix when it is missing or bad."""
    where = f"{field_name}={str(path)!r}"
    try:
        row = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{where} does not exist; point it at the master's trajectories/<split>/iter_NNNN/takeover.json"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where} cannot be read as JSON ({exc}); let the master write it again") from None
    if not isinstance(row, dict) or row.get("schema") != TAKEOVER_SCHEMA:
        got = row.get("schema") if isinstance(row, dict) else type(row).__name__
        raise ConfigError(f"{where} is not a {TAKEOVER_SCHEMA} file (got schema {got!r}); point it at a takeover.json")
    try:
        return TakeoverPlan(
            split=str(row["split"]),
            iteration=int(row["iteration"]),
            rank_weights=[float(w) for w in row["rank_weights"]],
            dead={int(d): _dead_rank(entry) for d, entry in row["dead"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{where} lacks or misspells a field ({type(exc).__name__}: {exc}); let the master write it again"
        ) from None


def assigned_specs(
    plan: TakeoverPlan, cfg: RolloutConfig, shares: Mapping[int, list[EpisodeSpec]], where: str
) -> dict[int, list[EpisodeSpec]]:
    """Dead rank -> the episodes of its share (`shares[d]`, as this rank plans it) that `plan` assigns to
    `cfg.rank`, in planned order. One ConfigError listing every way the plan does not fit this rollout."""
    problems: list[str] = []
    if (plan.split, plan.iteration) != (cfg.split, cfg.iteration):
        problems.append(
            f"{where} is the plan of split={plan.split} iteration={plan.iteration}, not of this rollout "
            f"(split={cfg.split} iteration={cfg.iteration}); pass this iteration's takeover.json"
        )
    if list(plan.rank_weights) != list(cfg.rank_weights):
        problems.append(
            f"{where} was made for rank_weights={plan.rank_weights} (got rank_weights={list(cfg.rank_weights)}); "
            "run the takeover with the cluster's rank_weights"
        )
    if cfg.rank in plan.dead:
        problems.append(f"{where} names rank {cfg.rank} dead (got rank={cfg.rank}); only survivors take over")
    mine = plan.assigned_to(cfg.rank)
    if not mine and cfg.rank not in plan.dead:
        survivors = sorted({s for entry in plan.dead.values() for s in entry.assignments})
        problems.append(
            f"{where} assigns nothing to rank {cfg.rank} (its survivors are {survivors}); "
            "run the takeover on the ranks it names"
        )
    specs: dict[int, list[EpisodeSpec]] = {}
    for dead, ids in mine.items():
        by_id = {s.episode_id: s for s in shares.get(dead, [])}
        stray = [i for i in ids if i not in by_id]
        if stray:
            problems.append(
                f"{where} assigns episodes of rank {dead} that are not in its share as this rank plans it "
                f"({', '.join(stray[:3])}{', ...' if len(stray) > 3 else ''}); the seed, task file and env_config "
                "must be the dead rank's"
            )
        wanted = set(ids)
        specs[dead] = [s for s in shares.get(dead, []) if s.episode_id in wanted]
    if problems:
        raise ConfigError(problems)
    return specs
