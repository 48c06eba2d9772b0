"""A seeded, tail-heavy multi-turn workload for benchmarking schedulers.

`LatencyEnv` is a real `Env` subclass: each episode plays a fixed number of
turns; after every reply the environment "works" for a while (an
`asyncio.sleep` standing in for a page load or a tool call) and answers with a
short observation. Everything random is drawn from the episode's own seeded
generator (`plan_episode`), so two schedulers given the same tasks face exactly
the same turn counts, environment latencies and reply lengths:

- environment latency per step: lognormal (median `latency_median_s`, shape
  `latency_sigma`), capped at `latency_cap_s` seconds;
- reply length per turn: lognormal (median `reply_median_tokens`, shape
  `reply_sigma`), capped at `reply_cap_tokens`; enforced on the server with
  `max_tokens = min_tokens = budget` so the generated token count is the same
  whatever is sampled;
- turns per episode: uniform in [`min_turns`, `max_turns`].

`BudgetedPolicy` is the engine's own `PolicyClient` with one change: the
per-turn reply budget comes from `REPLY_BUDGET`, a context variable the
environment sets before each generation (each episode runs in its own asyncio
task, so each sees its own value).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.policy import PolicyClient
from rollout_engine.types import Message, Task

#: completion tokens (exact) of the next generation of the current episode task
REPLY_BUDGET: contextvars.ContextVar[int] = contextvars.ContextVar("REPLY_BUDGET", default=16)


@dataclass(frozen=True)
class Workload:
    """Distributions of the benchmark workload (seconds, tokens)."""

    seed: int = 0
    min_turns: int = 2
    max_turns: int = 10
    latency_median_s: float = 0.5
    latency_sigma: float = 1.3
    latency_cap_s: float = 15.0
    reply_median_tokens: int = 8
    reply_sigma: float = 1.0
    reply_cap_tokens: int = 128


@dataclass(frozen=True)
class EpisodePlan:
    """What one episode will cost: one entry per turn."""

    latencies_s: tuple[float, ...]
    reply_tokens: tuple[int, ...]

    @property
    def turns(self) -> int:
        return len(self.latencies_s)


def plan_episode(workload: Workload, task_id: str) -> EpisodePlan:
    """The episode's turn count, latencies and reply budgets, a pure function of (seed, task id)."""
    digest = hashlib.sha256(f"{workload.seed}:{task_id}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    turns = rng.randint(workload.min_turns, workload.max_turns)
    latencies, replies = [], []
    for _ in range(turns):
        latency = workload.latency_median_s * math.exp(rng.gauss(0, workload.latency_sigma))
        latencies.append(round(min(workload.latency_cap_s, latency), 3))
        reply = round(workload.reply_median_tokens * math.exp(rng.gauss(0, workload.reply_sigma)))
        replies.append(max(1, min(workload.reply_cap_tokens, reply)))
    return EpisodePlan(tuple(latencies), tuple(replies))


def make_tasks(count: int) -> list[Task]:
    return [Task(task_id=f"bench-{i:04d}", task_name="latency benchmark", env="latency") for i in range(count)]


class LatencyEnv(Env):
    """Multi-turn episodes whose environment steps take seeded heavy-tailed time."""

    name = "latency"

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        plan = plan_episode(self.workload, task.task_id)
        state = EpisodeState(task=task, slot=slot, max_steps=plan.turns)
        state.data["plan"] = plan
        return state

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        REPLY_BUDGET.set(self.reply_budget(state))
        return [
            {
                "role": "user",
                "content": f"You explore a web site, step by step. Task {state.task.task_id}: "
                "describe what you would do next.",
            }
        ]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        turn = len(state.turns)
        await asyncio.sleep(state.data["plan"].latencies_s[turn])
        done = turn + 1 >= state.max_steps
        if not done:
            REPLY_BUDGET.set(self.reply_budget(state, turn + 1))
        return StepResult(observation=f"Step {turn + 1}: the page changed. What next?", done=done)

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=1.0, success=True, info={"turns": len(state.turns)})

    @staticmethod
    def reply_budget(state: EpisodeState, turn: int = 0) -> int:
        """The exact reply length of `turn` (also used by the lockstep baseline)."""
        return state.data["plan"].reply_tokens[turn]


class BudgetedPolicy(PolicyClient):
    """The engine's policy client, with max_tokens = min_tokens = REPLY_BUDGET for each request."""

    def request_args(self, messages: list[Message]) -> dict[str, Any]:
        args = super().request_args(messages)
        budget = REPLY_BUDGET.get()
        args["max_tokens"] = budget
        args["extra_body"] = {**(args["extra_body"] or {}), "min_tokens": budget}
        return args
