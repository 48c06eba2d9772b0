"""Where every episode of a rollout stands, for the live view and status.json.

The scheduler calls `start`, `attach` (the live `EpisodeState`, whose `phase`
the episode loop keeps current) and `finish`; `snapshot()` gives a JSON-ready
picture: one cell per episode (waiting, setup, generating, env, scoring, done,
failed), counters per state, successes, failures by kind, tokens so far, replies
cut at the token limit, and which rollout it is (split, iteration, rank).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from rollout_engine.envs.base import EpisodeState
from rollout_engine.types import Failure, Trajectory

CELL_STATES = ("waiting", "setup", "generating", "env", "scoring", "done", "failed")


@dataclass
class Cell:
    """One episode's place in the rollout."""

    state: str = "waiting"
    step: int = 0
    live: EpisodeState | None = None
    success: bool = False
    reward: float | None = None


@dataclass
class Progress:
    """Mutable picture of a running rollout (single event loop, so no locks)."""

    planned: int = 0
    skipped: int = 0
    #: which rollout this is (for readers of status.json: run.sh's terminal view, the dashboard)
    split: str | None = None
    iteration: int | None = None
    rank: int | None = None
    started_at: float = field(default_factory=time.time)
    cells: dict[str, Cell] = field(default_factory=dict)
    failures: collections.Counter = field(default_factory=collections.Counter)
    successes: int = 0
    completion_tokens: int = 0
    #: replies of the finished episodes cut at the token limit, and ok episodes whose last reply was (no success)
    truncated_turns: int = 0
    truncated_episodes: int = 0
    #: why the rollout stopped early because the policy server stopped answering (None while it answers)
    policy_down: str | None = None

    def add(self, episode_ids: list[str]) -> None:
        for episode_id in episode_ids:
            self.cells[episode_id] = Cell()
        self.planned = len(self.cells) + self.skipped

    def start(self, episode_id: str) -> None:
        cell = self.cells.setdefault(episode_id, Cell())
        cell.state, cell.live = "setup", None

    def attach(self, episode_id: str, state: EpisodeState) -> None:
        self.cells[episode_id].live = state

    def finish(self, trajectory: Trajectory) -> None:
        cell = self.cells.setdefault(trajectory.episode_id, Cell())
        cell.state = "done" if trajectory.status is Failure.OK else "failed"
        cell.step, cell.live, cell.success = len(trajectory.turns), None, trajectory.success
        cell.reward = trajectory.reward
        self.successes += int(trajectory.success)
        self.completion_tokens += sum(t.completion_tokens for t in trajectory.turns)
        self.truncated_turns += sum(t.truncated for t in trajectory.turns)
        ok = trajectory.status is Failure.OK
        self.truncated_episodes += int(ok and bool(trajectory.turns) and trajectory.turns[-1].truncated)
        if trajectory.status is not Failure.OK:
            self.failures[trajectory.status.value] += 1

    def cell_state(self, cell: Cell) -> tuple[str, int]:
        if cell.live is not None:
            return cell.live.phase if cell.live.phase in CELL_STATES else "env", len(cell.live.turns)
        return cell.state, cell.step

    def snapshot(self) -> dict[str, Any]:
        counts: collections.Counter = collections.Counter()
        cells = []
        for episode_id, cell in self.cells.items():
            state, step = self.cell_state(cell)
            counts[state] += 1
            cells.append(
                {"episode_id": episode_id, "state": state, "step": step, "success": cell.success, "reward": cell.reward}
            )
        finished = counts["done"] + counts["failed"]
        elapsed = time.time() - self.started_at
        return {
            "split": self.split,
            "iteration": self.iteration,
            "rank": self.rank,
            "planned": self.planned,
            "skipped_resumed": self.skipped,
            "finished": finished,
            "counts": {s: counts[s] for s in CELL_STATES},
            "successes": self.successes,
            "failures": dict(self.failures),
            "elapsed_s": round(elapsed, 2),
            "completion_tokens": self.completion_tokens,
            "truncated_turns": self.truncated_turns,
            "truncated_episodes": self.truncated_episodes,
            "policy_down": self.policy_down,
            "updated_at": time.time(),
            "cells": cells,
        }
