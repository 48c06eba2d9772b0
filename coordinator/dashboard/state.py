"""Everything the dashboard page shows, read from the log path as one JSON-able snapshot.

    board = Board(log_path)
    board.snapshot()                      # dict: run, troubles, rollouts, grid, training, iterations, charts
    board.snapshot(("test", 2))           # the grid of another rollout
    board.episode("train", 3, "rg-0042#1")

Progress and trouble come from coordinator.runview (the same reader as run.sh's
terminal view), the per-iteration records from coordinator.summary, the curves
from metrics.jsonl, the episodes from the journals (dashboard.journals). One
Board lives as long as the server: its StallWatch judges silence on this
process's clock, so a stalled rank shows after it has been quiet a while
*while the page is served*. Nothing here writes under the log path.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator import groupfile
from coordinator.dashboard.journals import Journals
from coordinator.dashboard.svg import Chart, Series
from coordinator.driver.trainer import GROUP as TRAINER_GROUP
from coordinator.runstate import load_markers, state_iterations
from coordinator.runview import RankRollout, RunView, StallWatch, Trouble
from coordinator.summary import iteration_records
from rollout_engine.journal import load_manifest
from rollout_engine.layout import GROUPS_NAME, Layout, journal_name, manifest_name
from rollout_engine.metrics_log import load_metrics
from training.warm import job_running

#: tracked groups that are helpers of a phase, not a phase (coordinator/driver/run.py: run.group_names)
_HELPERS = re.compile(r"watch.*|vllm|heartbeat.*|dashboard.*")
#: a rollout with at least this share of failed episodes (and 3 or more) is trouble
FAILED_SHARE = 0.2


@dataclass
class _Quiet:
    """How long a value has not changed, on our monotonic clock."""

    seen: dict[Any, tuple[Any, float]] = field(default_factory=dict)

    def note(self, key: Any, value: Any, now: float) -> float:
        old = self.seen.get(key)
        if old is None or old[0] != value:
            self.seen[key] = old = (value, now)
        return now - old[1]


def rollout_dict(r: RankRollout) -> dict[str, Any]:
    """A rank's rollout for the page (without its cells: the grid has them)."""
    return {
        "rank": r.rank,
        "split": r.split,
        "iteration": r.iteration,
        "planned": r.planned,
        "todo": r.todo,
        "resumed": r.resumed,
        "finished": r.finished,
        "successes": r.successes,
        "running": r.running,
        "failures": r.failures,
        "truncated_turns": r.truncated_turns,
        "tokens_per_s": round(r.tokens_per_s, 2),
        "elapsed_s": round(r.elapsed_s, 1),
        "eta_s": None if r.eta_s is None else round(r.eta_s, 1),
        "done": r.done,
    }


def running_groups(log: Path) -> list[dict[str, Any]]:
    """The phases running now, by rank: the process groups run.sh recorded (run/rank_<r>/groups.json). The warm
    trainer is a phase only while it works on a job (update or update-check); between jobs it waits."""
    found = []
    for path in sorted(log.glob(f"run/rank_*/{GROUPS_NAME}")):
        rank = path.parent.name.removeprefix("rank_")
        if not rank.isdigit():
            continue
        for name in sorted(groupfile.read(path)):
            if name == TRAINER_GROUP:
                name = job_running(Layout(log).trainer_dir(int(rank)))
            if name and not _HELPERS.fullmatch(name):
                found.append({"rank": int(rank), "phase": name})
    return found


def markers(log: Path, iteration: int) -> dict[str, str]:
    """The iteration's phase markers: {phase: content} of run/state/iter_<NNNN>/<phase>.done ("" for a marker
    that holds only the time it was written: `update: promoted v3` says something, `1795503157` does not)."""
    return {phase: "" if content.isdigit() else content for phase, content in load_markers(log, iteration).items()}


def update_troubles(log: Path, iterations: list[int]) -> list[Trouble]:
    """A failed or skipped update among the last three iterations, with what to do."""
    troubles = []
    for n in iterations[-3:]:
        outcome = markers(log, n).get("update", "")
        logs = Layout(log).phase_log(0, n, "update")
        if outcome.startswith("failed"):
            troubles.append(Trouble(None, f"iteration {n}'s update {outcome}", f"read {logs}; the policy is unchanged"))
        elif outcome.startswith("skipped"):
            troubles.append(
                Trouble(
                    None,
                    f"iteration {n}'s update was {outcome}",
                    f"see {Layout(log).training_dir(n)}/selection.json (nothing to train on?) and {logs}",
                )
            )
    return troubles


def failure_troubles(rollouts: list[RankRollout]) -> list[Trouble]:
    troubles = []
    for r in rollouts:
        failed = sum(r.failures.values())
        if failed >= 3 and failed >= FAILED_SHARE * max(r.finished, 1):
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items()))
            troubles.append(
                Trouble(
                    r.rank,
                    f"{failed} of {r.finished} {r.split} episodes failed ({kinds})",
                    "click a red cell of the grid to read its error; docs/troubleshooting.md lists each kind",
                )
            )
    return troubles


def last_rollout_records(log: Path) -> list[dict[str, Any]]:
    """The last `kind: rollout` record of each (split, iteration) in metrics.jsonl, by iteration."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for row in load_metrics(log):
        if row.get("kind") == "rollout" and not row.get("takeover_of") and isinstance(row.get("iteration"), int):
            last[(str(row.get("split")), row["iteration"])] = row
    return [last[k] for k in sorted(last, key=lambda k: (k[1], k[0]))]


def _points(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(r["iteration"], scale * r[key]) for r in rows if isinstance(r.get(key), int | float)]


def build_charts(log: Path, training_losses: list[tuple[int, float]], training_iteration: int | None) -> list[Chart]:
    """The curves: success, loss, reply length, replies cut, tokens/s per rank, time per phase."""
    rollouts = last_rollout_records(log)
    train = [r for r in rollouts if r.get("split") == "train"]
    test = [r for r in rollouts if r.get("split") == "test"]
    records = iteration_records(log)
    trainings = [r for r in load_metrics(log) if r.get("kind") == "training" and isinstance(r.get("iteration"), int)]
    charts = [
        Chart(
            "success rate (%)",
            [
                Series("train", _points(train, "success_rate", 100)),
                Series("held-out", _points(test, "success_rate", 100)),
            ],
            y_min=0,
            y_max=100,
        ),
        Chart("training loss (per iteration)", [Series("train_loss", _points(trainings, "train_loss"))]),
    ]
    if training_losses:
        steps = [(float(s), loss) for s, loss in training_losses]
        charts.append(Chart(f"loss per step, iteration {training_iteration}", [Series("loss", steps)], x_label="step"))
    charts.append(
        Chart(
            "reply length (completion tokens per turn)",
            [
                Series("train", _points(train, "mean_response_tokens")),
                Series("held-out", _points(test, "mean_response_tokens")),
            ],
            y_min=0,
        )
    )
    if any("truncated_turn_rate" in r for r in rollouts):  # records written before it was counted have none
        charts.append(
            Chart(
                "replies cut at the token limit (% of turns)",
                [
                    Series("train", _points(train, "truncated_turn_rate", 100)),
                    Series("held-out", _points(test, "truncated_turn_rate", 100)),
                ],
                y_min=0,
            )
        )
    charts.append(Chart("train rollout tokens/s per rank", tokens_per_rank(train), y_min=0))
    phases = sorted({name for r in records for name in r.get("phase_s") or {}})
    charts.append(
        Chart(
            "seconds per phase",
            [
                Series(p, [(r["iteration"], r["phase_s"][p]) for r in records if p in (r.get("phase_s") or {})])
                for p in phases
            ],
            y_min=0,
        )
    )
    return charts


def tokens_per_rank(rows: list[dict[str, Any]]) -> list[Series]:
    """tokens/s of each rank per iteration: a merged record's `per_rank`, else the record's own rank."""
    by_rank: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        per_rank = r.get("per_rank") or {str(r.get("rank") or 0): r}
        for rank, own in sorted(per_rank.items()):
            if own and isinstance(own.get("tokens_per_s"), int | float):
                by_rank.setdefault(rank, []).append((r["iteration"], own["tokens_per_s"]))
    return [Series(f"rank {rank}", points) for rank, points in sorted(by_rank.items(), key=lambda kv: int(kv[0]))]


class Board:
    """The dashboard's view of one log path; thread-safe (the server answers requests in threads)."""

    def __init__(self, log: Path, stalls: StallWatch | None = None, clock: Any = time.monotonic) -> None:
        self.log = Path(log)
        self.view = RunView(self.log)
        self.journals = Journals(self.log)
        self.stalls = stalls or StallWatch(clock=clock)
        self.clock = clock
        self._beats = _Quiet()
        self._lock = threading.Lock()

    def snapshot(self, chosen: tuple[str, int] | None = None) -> dict[str, Any]:
        rollouts = self.view.rollouts()
        iterations = state_iterations(self.log)
        with self._lock:
            troubles = self.stalls.observe(self.view, rollouts=rollouts)
            nodes = self.nodes()
        troubles += update_troubles(self.log, iterations) + failure_troubles(rollouts)
        current = iterations[-1] if iterations else max((r.iteration or 0 for r in rollouts), default=None)
        training = self.view.training(current) if current is not None else None
        charts = build_charts(self.log, training.losses if training else [], current)
        return {
            "log_path": str(self.log),
            "run": {
                "iteration": current,
                "phases": running_groups(self.log),
                "markers": markers(self.log, current) if current is not None else {},
                "nodes": nodes,
            },
            "troubles": [asdict(t) for t in troubles],
            "rollouts": [rollout_dict(r) for r in rollouts],
            "grid": self.grid(rollouts, chosen),
            "training": None if training is None else {**asdict(training), "losses": None},
            "iterations": iteration_records(self.log),
            "charts": [{"title": c.title, "svg": c.svg()} for c in charts],
        }

    def nodes(self) -> list[dict[str, Any]]:
        """The current run's nodes by heartbeat, each with how long its beat has not changed (our clock)."""
        now = self.clock()
        found = []
        for rank, beat in sorted(self.view.heartbeats().items()):
            quiet = self._beats.note(rank, (beat.seq, beat.pid), now)
            found.append(
                {**asdict(beat), "rank": rank, "quiet_s": round(quiet, 1), "late": quiet >= self.stalls.beat_s}
            )
        return found

    def grid(self, rollouts: list[RankRollout], chosen: tuple[str, int] | None) -> dict[str, Any]:
        """One row of cells per rank for the chosen rollout (default: the live one, else the latest journaled)."""
        choices = self.journals.rollouts()
        live = {(r.split, r.iteration) for r in rollouts if r.split is not None and r.iteration is not None}
        choices = sorted(set(choices) | live, key=lambda s: (s[1], s[0]))
        if chosen is None and rollouts:
            newest = max(rollouts, key=lambda r: (r.iteration or 0, not r.done))
            chosen = (newest.split, newest.iteration) if newest.split is not None else None
        if chosen is None and choices:
            chosen = choices[-1]
        ranks: dict[int, dict[str, Any]] = {}
        if chosen is not None:
            split, iteration = chosen
            for rank, cells in self.journals.cells(split, iteration).items():
                ranks[rank] = {
                    "rank": rank,
                    "live": False,
                    "planned": self.planned(split, iteration, rank, cells),
                    "cells": cells,
                }
            for r in rollouts:
                if (r.split, r.iteration) == chosen:
                    rank = r.rank or 0
                    ranks[rank] = {"rank": rank, "live": True, "planned": r.planned, "cells": r.cells}
        return {
            "split": chosen[0] if chosen else None,
            "iteration": chosen[1] if chosen else None,
            "choices": [{"split": s, "iteration": n} for s, n in choices],
            "ranks": [ranks[k] for k in sorted(ranks)],
        }

    def planned(self, split: str, iteration: int, rank: int, cells: list[dict[str, Any]]) -> int:
        """A journal's planned episodes: its sealed manifest's `planned`, else what it holds so far."""
        manifest = Layout(self.log).iteration_dir(split, iteration) / manifest_name(journal_name(rank))
        try:
            return int((load_manifest(manifest, strict=False) or {})["planned"])
        except (OSError, ValueError, KeyError, TypeError):
            return len(cells)

    def episode(self, split: str, iteration: int, episode_id: str) -> dict[str, Any] | None:
        return self.journals.episode(split, iteration, episode_id)
