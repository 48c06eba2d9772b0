"""Typed records passed between the rollout engine's layers.

`Task` is one line of a task file, `Completion` one model reply, `Turn` one
step of an episode and `Trajectory` one finished episode: the unit written to
the per-rank journal (docs/formats.md describes the JSON form).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "baton.trajectory/1"
#: the trajectory file `python -m rollout_engine.demonstrations` writes (and `data.demonstrations` reads)
DEMONSTRATIONS_FILE = "demonstrations.jsonl"

Message = dict[str, Any]


class Failure(enum.StrEnum):
    """Why an episode ended; everything but OK is excluded from success rates."""

    OK = "ok"
    ENV_ERROR = "env_error"
    MODEL_ERROR = "model_error"
    JUDGE_ERROR = "judge_error"
    TIMEOUT = "timeout"
    CONTEXT_OVERFLOW = "context_overflow"
    CANCELLED = "cancelled"

    @property
    def is_infra(self) -> bool:
        """Infrastructure failures are retried and never trained on."""
        return self is not Failure.OK


@dataclass(frozen=True)
class Task:
    """One task-file line. `metadata` holds environment-specific fields."""

    task_id: str
    task_name: str
    difficulty: int = 1
    env: str = ""
    family: str = ""
    definite_answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Task:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = {k: v for k, v in row.items() if k not in known}
        kwargs = {k: v for k, v in row.items() if k in known}
        kwargs["metadata"] = {**extra, **(row.get("metadata") or {})}
        kwargs["task_id"] = str(kwargs["task_id"])
        return cls(**kwargs)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: a task and which of its samples this is."""

    task: Task
    sample_index: int

    @property
    def episode_id(self) -> str:
        return f"{self.task.task_id}#{self.sample_index}"


@dataclass
class Completion:
    """One chat-completion reply with the token ids and log-probabilities vLLM returns on request."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    #: the log-probability of each sampled token, 1:1 with completion_token_ids (vLLM's `logprobs`)
    completion_logprobs: list[float] | None = None


#: the finish_reason of a reply cut at the token limit (policy_config.max_new_tokens)
CUT = "length"


@dataclass(frozen=True)
class Observation:
    """What an environment shows the model: text, and images beside it (screenshots). An environment returns one
    instead of a plain string (StepResult.observation, or a message's content in initial_messages) to send images;
    the episode loop turns it into the message's content parts (rollout_engine/images.py)."""

    text: str
    #: image files the environment wrote, relative to the iteration directory (RunContext.log_dir), oldest first
    images: tuple[str, ...] = ()


@dataclass
class Turn:
    """One policy step: exactly what was sent, what came back, what it did."""

    index: int
    messages: list[Message]
    #: the reply exactly as sampled, reasoning included (what the update trains)
    response: str
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    #: the policy's log-probability of each sampled token, 1:1 with completion_token_ids (docs/formats.md);
    #: None when not recorded (policy_config.return_logprobs off, or a journal written before the field)
    completion_logprobs: list[float] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    action: dict[str, Any] | None = None
    invalid_action: bool = False
    observation: str | None = None
    reward: float = 0.0
    state_changed: bool = True
    #: the page the model saw at this step, relative to the journal's directory: the environment's screenshot, or
    #: the images of the observation this turn's prompt ended on (every image sent is in `messages` by file:// URL)
    images: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    #: what the environment was given when it differs from `response`: the answer after a thinking model's
    #: reasoning ("" when the reasoning never ended); None: it was given `response` whole (rollout_engine.reasoning)
    env_reply: str | None = None

    @property
    def env_text(self) -> str:
        """The text the environment was given."""
        return self.response if self.env_reply is None else self.env_reply

    @property
    def truncated(self) -> bool:
        """The reply was cut at the token limit."""
        return self.finish_reason == CUT


@dataclass
class Trajectory:
    """One finished episode, the unit of the journal."""

    episode_id: str
    task_id: str
    sample_index: int
    split: str
    iteration: int
    rank: int
    env: str
    family: str
    difficulty: int
    status: Failure = Failure.OK
    error: str | None = None
    reward: float = 0.0
    success: bool = False
    turns: list[Turn] = field(default_factory=list)
    policy_model: str = ""
    policy_version: int | None = None
    attempts: int = 1
    started_at: float = 0.0
    finished_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return {"schema": SCHEMA, **out}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Trajectory:
        row = {k: v for k, v in row.items() if k != "schema"}
        try:
            row["status"] = Failure(row["status"])
        except ValueError:
            known = ", ".join(f.value for f in Failure)
            raise ValueError(f"status must be one of {known} (got {row['status']!r})") from None
        turns = row.get("turns", [])
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ValueError(f"turns must be a list of objects (got {str(turns)[:80]})")
        row["turns"] = [Turn(**t) for t in turns]
        for turn in row["turns"]:
            problem = logprobs_problem(turn.completion_token_ids, turn.completion_logprobs)
            if problem:
                raise ValueError(f"turn {turn.index}: {problem}")
        return cls(**row)


def logprobs_problem(token_ids: list[int] | None, logprobs: list[float] | None) -> str:
    """Why `logprobs` cannot be the sampled tokens' log-probabilities of `token_ids` ("" if they can): one per
    id, in order. Never padded or cut to fit: a ratio formed against the wrong token would train on noise."""
    if logprobs is None:
        return ""
    if token_ids is None:
        return f"completion_logprobs has {len(logprobs)} values but completion_token_ids is null"
    if len(logprobs) != len(token_ids):
        return (
            f"completion_logprobs has {len(logprobs)} values for {len(token_ids)} completion_token_ids "
            "(they must align 1:1)"
        )
    return ""
