"""The one episode loop every environment shares, and the hooks it calls.

An environment subclasses `Env` and overrides small hooks:

- `start` / `close`: shared resources for the whole rollout (a browser).
- `setup_state(task, slot)`: per-episode state (a page, a game).
- `initial_messages(state)`: the chat that opens the episode (a message's content
  may be an `Observation`: text with images).
- `env_response(state, reply)`: apply the model's reply, return a `StepResult`
  (its observation a string, or an `Observation` to show the model images).
- `score(state)`: the final reward once the loop has ended.
- `teardown_state(state)`: release per-episode resources (always called).
- `expert(task)`: a scripted policy that solves the task, for demonstrations
  (`python -m rollout_engine.demonstrations`); None where the environment has none.

The loop (`run_episode`) lives here once; environments never call the model.
It keeps `state.phase` current (setup, generating, env, scoring, done) for the
live view, and hands the state to `on_state` as soon as it exists, so the
engine keeps the turns of an episode that later fails or times out.

Thinking models: the loop splits each reply once (`rollout_engine.reasoning`,
by `model_config.reasoning`) and hands `env_response` only the answer after the
reasoning; the turn keeps the reply as sampled (`Turn.response`, with
`Turn.env_reply` when the environment saw less), and the next turn's history
carries the full reply (the model's chat template drops old reasoning itself).
A reply cut at the token limit (`finish_reason` length) is played like any
other, but when it is the episode's last the episode is no success: reward 0,
and `info.truncated` says why (`info.env_reward` keeps the environment's).

Images (`rollout_engine/images.py`): an `Observation`'s images are files the
environment wrote under the iteration directory (`RunContext.images_dir`); the
loop sends them by `file://` URL and keeps the newest `images_per_prompt` in the
history (`vllm_config.limit_mm_per_prompt.image`; older ones become a short text
stub), so that prompts stay within the context and vLLM's limit. Each turn
records the messages exactly as sent and, in `images`, the page the model saw.

Constructors take their YAML parameters plus `context: RunContext` (see
`rollout_engine.config`); `envs/reasoning_gym.py` is the worked example.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollout_engine.images import DEFAULT_IMAGES_PER_PROMPT, as_message, keep_newest_images
from rollout_engine.reasoning import SplitReply, split_reply
from rollout_engine.types import Completion, Message, Observation, Task, Turn


class ChatPolicy(Protocol):
    """What the episode loop needs from the model client."""

    async def chat(self, messages: list[Message]) -> Completion: ...


class Expert(ChatPolicy, Protocol):
    """A scripted policy (`Env.expert`); `name` is recorded as the trajectory's `policy_model`."""

    name: str


@dataclass
class StepResult:
    """What the environment says after applying one reply."""

    #: the next user message: text, or text with images (Observation); None adds none
    observation: str | Observation | None
    reward: float = 0.0
    done: bool = False
    invalid_action: bool = False
    action: dict[str, Any] | None = None
    state_changed: bool = True
    #: screenshots of the page the model saw at this step, kept for people (not sent; relative to the iteration
    #: directory); empty: the turn records the images of the observation it was shown
    images: list[str] = field(default_factory=list)


@dataclass
class Score:
    """Final outcome of an episode. `judge_error` marks an unusable verdict."""

    reward: float
    success: bool
    judge_error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeState:
    """Per-episode state; environments keep their own objects in `data`."""

    task: Task
    slot: int
    max_steps: int
    turns: list[Turn] = field(default_factory=list)
    invalid_actions: int = 0
    done: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    #: setup, generating, env, scoring or done (read by the live view)
    phase: str = "setup"
    #: `<task_id>#<sample_index>`, set by `run_episode` (names per-episode files such as screenshots)
    episode_id: str = ""


class Env(abc.ABC):
    """Base class: one episode loop, small hooks for the environment."""

    name: str = "env"
    #: default step budget when the task and config give none
    max_steps: int = 1
    #: end the episode on the first invalid action (else count it and go on)
    stop_on_invalid: bool = False

    def check_task(self, task: Task) -> str | None:
        """Say what is wrong with a task for this environment (None: fine); run on load, before any work."""
        return None

    async def start(self) -> None:
        """Acquire resources shared by all episodes (called once)."""
        return None

    async def close(self) -> None:
        """Release what `start` acquired (called once, also on cancel)."""
        return None

    @abc.abstractmethod
    async def setup_state(self, task: Task, slot: int) -> EpisodeState: ...

    @abc.abstractmethod
    def initial_messages(self, state: EpisodeState) -> list[Message]: ...

    @abc.abstractmethod
    async def env_response(self, state: EpisodeState, reply: str) -> StepResult: ...

    @abc.abstractmethod
    async def score(self, state: EpisodeState) -> Score: ...

    async def teardown_state(self, state: EpisodeState) -> None:
        """Release per-episode resources; always called."""
        return None

    async def expert(self, task: Task) -> Expert | None:
        """A scripted policy that solves `task` through this same episode loop (demonstrations), or None."""
        return None

    async def run_episode(
        self,
        task: Task,
        slot: int,
        policy: ChatPolicy,
        on_state: Callable[[EpisodeState], None] | None = None,
        episode_id: str = "",
        reasoning: str = "auto",
        media_root: Path | None = None,
        images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT,
    ) -> tuple[EpisodeState, Score]:
        """Play one episode to the end and score it; `reasoning` is `model_config.reasoning` (auto, think, none).
        Observations with images are sent by file:// URL of their files under `media_root` (the iteration
        directory), the newest `images_per_prompt` of them (older ones become a text stub)."""
        state = await self.setup_state(task, slot)
        state.episode_id = episode_id or state.episode_id or task.task_id
        if on_state is not None:
            on_state(state)
        try:
            opening = list(self.initial_messages(state))
            seen = _images_of(opening)
            messages = [as_message(m, media_root) for m in opening]
            for index in range(state.max_steps):
                started = time.monotonic()
                state.phase = "generating"
                messages = keep_newest_images(messages, images_per_prompt)
                reply = await policy.chat(messages)
                state.phase = "env"
                split = split_reply(reply.text, reasoning)
                result = await self.env_response(state, split.answer)
                turn = _turn(index, messages, reply, split, result, time.monotonic() - started)
                turn.images = turn.images or list(seen)
                state.turns.append(turn)
                state.invalid_actions += int(result.invalid_action)
                if result.done or (result.invalid_action and self.stop_on_invalid):
                    break
                messages = [*messages, {"role": "assistant", "content": reply.text}]
                if result.observation is not None:
                    seen = _images_of([{"content": result.observation}])
                    messages.append(as_message({"role": "user", "content": result.observation}, media_root))
            state.done = True
            state.phase = "scoring"
            score = await self.score(state)
            if state.turns and state.turns[-1].truncated:
                score = _cut_score(score)
            state.phase = "done"
            return state, score
        finally:
            await self.teardown_state(state)


def _cut_score(score: Score) -> Score:
    """The score of an episode whose last reply was cut at the token limit: never a success, whatever the
    environment made of the partial reply (a verdict on it, judge error included, is moot)."""
    why = "the last reply was cut at the token limit (finish_reason length), so the episode is no success"
    info = {**score.info, "truncated": why, "env_reward": score.reward}
    if score.judge_error:
        info["judge_error"] = score.judge_error
    return Score(reward=0.0, success=False, info=info)


def _images_of(messages: list[Message]) -> tuple[str, ...]:
    """The images of the last observation among `messages` (what the model sees of the page now)."""
    shown = [m["content"].images for m in messages if isinstance(m.get("content"), Observation)]
    return shown[-1] if shown else ()


def _turn(
    index: int, messages: list[Message], reply: Completion, split: SplitReply, result: StepResult, latency: float
) -> Turn:
    return Turn(
        index=index,
        messages=list(messages),
        response=reply.text,
        env_reply=split.answer if split.has_reasoning else None,
        prompt_token_ids=reply.prompt_token_ids,
        completion_token_ids=reply.completion_token_ids,
        completion_logprobs=reply.completion_logprobs,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        finish_reason=reply.finish_reason,
        action=result.action,
        invalid_action=result.invalid_action,
        observation=result.observation.text if isinstance(result.observation, Observation) else result.observation,
        reward=result.reward,
        state_changed=result.state_changed,
        images=list(result.images),
        latency_s=round(latency, 4),
    )
