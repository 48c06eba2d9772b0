"""The lockstep baseline: a naive batched rollout, for comparison with the engine.

Episodes run in batches of `batch_size` (the environment slots). Inside a
batch, turn k of every live episode is generated together (all requests sent,
all awaited), then every environment step of turn k runs together, and only
then does turn k+1 start: the slowest reply and the slowest environment step of
each turn set its pace, and the next batch waits for the batch's longest
episode. It uses the same `Env` hooks and the same policy client as the engine
(so the same request limit, `max_vllm_sessions`); only the scheduling differs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.workload import REPLY_BUDGET, LatencyEnv
from rollout_engine.envs.base import ChatPolicy, Env, EpisodeState
from rollout_engine.types import Completion, Message, Task, Turn

logger = logging.getLogger(__name__)


@dataclass
class Episode:
    """One episode of the baseline: its state and the chat so far."""

    state: EpisodeState
    messages: list[Message]


async def _generate(policy: ChatPolicy, episode: Episode) -> Completion:
    REPLY_BUDGET.set(LatencyEnv.reply_budget(episode.state, len(episode.state.turns)))
    return await policy.chat(episode.messages)


async def _step(env: Env, episode: Episode, reply: Completion) -> bool:
    """Apply one reply; True when the episode is over."""
    state = episode.state
    result = await env.env_response(state, reply.text)
    state.turns.append(
        Turn(
            index=len(state.turns),
            messages=list(episode.messages),
            response=reply.text,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            observation=result.observation,
        )
    )
    if result.done or len(state.turns) >= state.max_steps:
        return True
    episode.messages = [*episode.messages, {"role": "assistant", "content": reply.text}]
    if result.observation is not None:
        episode.messages.append({"role": "user", "content": result.observation})
    return False


async def run_batch(env: Env, policy: ChatPolicy, tasks: list[Task]) -> list[EpisodeState]:
    """Play one batch in lockstep: every turn waits for all generations, then for all environment steps."""
    states = await asyncio.gather(*(env.setup_state(task, slot) for slot, task in enumerate(tasks)))
    episodes = [Episode(state, list(env.initial_messages(state))) for state in states]
    live = list(episodes)
    try:
        while live:
            replies = await asyncio.gather(*(_generate(policy, e) for e in live))
            finished = await asyncio.gather(*(_step(env, e, r) for e, r in zip(live, replies, strict=True)))
            live = [e for e, done in zip(live, finished, strict=True) if not done]
        for state in states:
            await env.score(state)
    finally:
        await asyncio.gather(*(env.teardown_state(s) for s in states), return_exceptions=True)
    return list(states)


async def run_lockstep(
    env: Env,
    policy: ChatPolicy,
    tasks: list[Task],
    batch_size: int,
    on_batch: Callable[[int, float], None] | None = None,
) -> list[EpisodeState]:
    """Every task in batches of `batch_size`, one batch after the other."""
    done: list[EpisodeState] = []
    for start in range(0, len(tasks), batch_size):
        began = time.monotonic()
        done += await run_batch(env, policy, tasks[start : start + batch_size])
        if on_batch is not None:
            on_batch(len(done), time.monotonic() - began)
    return done
