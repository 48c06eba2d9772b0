"""Rollout metrics: computed from the trajectories, appended to `<log>/metrics.jsonl`, printed as a table.

Only `ok` trajectories count in success rates (`judge_error` and the other
failure kinds are excluded, never turned into 0 or 1). Keys of the
`"kind": "rollout"` line:

- `success_rate` (successes / ok episodes), `success_rate_by_difficulty`,
  `success_rate_by_family`, `task_solved_rate` (tasks with >= 1 success /
  tasks with >= 1 ok episode), `mean_reward`;
- `episodes`, `ok_episodes`, `planned`, `cancelled`, `failures` (count per
  kind), `failure_rate_by_kind` (per kind / episodes);
- `mean_steps`, `mean_response_tokens` (completion tokens per turn),
  `invalid_action_rate` (invalid turns / turns);
- `truncated_turns` (replies cut at the token limit, finish_reason length),
  `truncated_turn_rate` (those / turns), `truncated_episodes` (ok episodes
  whose last reply was cut: each scored no success, rollout_engine.envs.base);
- `wall_s`, `episodes_per_s`, `tokens_per_s` (completion tokens / wall time);
- `split`, `iteration`, `rank`, `policy_model`, `policy_version`, `time`.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

from rollout_engine.files import append_line, append_shared_line
from rollout_engine.types import Failure, Trajectory


def _rate(successes: int, total: int) -> float | None:
    return round(successes / total, 4) if total else None


def _rates_by(trajectories: list[Trajectory], key: str) -> dict[str, float | None]:
    groups: dict[str, list[bool]] = collections.defaultdict(list)
    for t in trajectories:
        groups[str(getattr(t, key))].append(t.success)
    return {k: _rate(sum(v), len(v)) for k, v in sorted(groups.items())}


def compute_metrics(trajectories: list[Trajectory], wall_s: float, planned: int, cancelled: int) -> dict[str, Any]:
    """The metrics of one rollout (all trajectories of this run, resumed ones included)."""
    ok = [t for t in trajectories if t.status is Failure.OK]
    turns = [turn for t in trajectories for turn in t.turns]
    tokens = sum(turn.completion_tokens for turn in turns)
    cut = sum(turn.truncated for turn in turns)
    failures = collections.Counter(t.status.value for t in trajectories if t.status is not Failure.OK)
    solved: dict[str, bool] = {}
    for t in ok:
        solved[t.task_id] = solved.get(t.task_id, False) or t.success
    wall = max(wall_s, 1e-9)
    return {
        "kind": "rollout",
        "success_rate": _rate(sum(t.success for t in ok), len(ok)),
        "success_rate_by_difficulty": _rates_by(ok, "difficulty"),
        "success_rate_by_family": _rates_by(ok, "family"),
        "task_solved_rate": _rate(sum(solved.values()), len(solved)),
        "mean_reward": round(sum(t.reward for t in ok) / len(ok), 4) if ok else None,
        "episodes": len(trajectories),
        "ok_episodes": len(ok),
        "planned": planned,
        "cancelled": cancelled,
        "failures": dict(failures),
        "failure_rate_by_kind": {k: round(v / len(trajectories), 4) for k, v in failures.items()},
        "mean_steps": round(sum(len(t.turns) for t in trajectories) / len(trajectories), 3) if trajectories else None,
        "mean_response_tokens": round(tokens / len(turns), 2) if turns else None,
        "invalid_action_rate": _rate(sum(turn.invalid_action for turn in turns), len(turns)),
        "truncated_turns": cut,
        "truncated_turn_rate": _rate(cut, len(turns)),
        "truncated_episodes": sum(bool(t.turns) and t.turns[-1].truncated for t in ok),
        "wall_s": round(wall_s, 3),
        "episodes_per_s": round(len(trajectories) / wall, 4),
        "tokens_per_s": round(tokens / wall, 2),
        "time": time.time(),
    }


def save_metrics(path: Path, metrics: dict[str, Any], shared: bool = True) -> None:
    """Append one JSON line to `<log>/metrics.jsonl` (fsynced), under its lock unless `shared` is False (a file
    that only this process writes: a rank's own `metrics/rank_<r>.jsonl`)."""
    (append_shared_line if shared else append_line)(path, json.dumps(metrics, sort_keys=True))


def print_summary(metrics: dict[str, Any]) -> None:
    """A rich table of the headline numbers, on stderr."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rollout {metrics.get('split')} iter {metrics.get('iteration')} rank {metrics.get('rank')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "success_rate",
        "task_solved_rate",
        "mean_reward",
        "episodes",
        "ok_episodes",
        "planned",
        "cancelled",
        "mean_steps",
        "mean_response_tokens",
        "invalid_action_rate",
        "truncated_turn_rate",
        "truncated_episodes",
        "wall_s",
        "episodes_per_s",
        "tokens_per_s",
    ):
        table.add_row(key, str(metrics.get(key)))
    for kind, count in sorted(metrics.get("failures", {}).items()):
        table.add_row(f"failures.{kind}", str(count))
    for family, rate in metrics.get("success_rate_by_family", {}).items():
        table.add_row(f"success_rate.{family}", str(rate))
    Console(stderr=True).print(table)
