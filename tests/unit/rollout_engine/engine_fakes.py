"""A whole rollout without a model server: a one-turn echo environment, a policy that always answers, a config.

write_tasks(tmp_path / "data", 9)
use_fake_policy(monkeypatch)
code = await run_rollout(rollout_config(tmp_path, rank=0, rank_weights=[1, 1, 1]), "resolved: yaml")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from omegaconf import OmegaConf

from rollout_engine import runner
from rollout_engine.config import EnvConfig, RolloutConfig
from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.types import Completion, Message, Task


class EchoEnv(Env):
    """One turn; every episode succeeds."""

    name = "echo"
    #: task ids of the episodes set up, across instances (a resume must not set a journaled one up again)
    set_up: ClassVar[list[str]] = []

    def __init__(self, context: RunContext) -> None:
        self.context = context

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        EchoEnv.set_up.append(task.task_id)
        return EpisodeState(task=task, slot=slot, max_steps=1)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        return [{"role": "user", "content": state.task.task_name}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        return StepResult(observation=None, done=True)

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=1.0, success=True)


class FakePolicy:
    """Stands in for rollout_engine.policy.PolicyClient: the server answers, every reply is 'ok'."""

    def __init__(self, config: Any, sessions: int, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.config = config
        self.chat_template_kwargs = chat_template_kwargs

    async def check_server(self) -> None:
        return None

    async def chat(self, messages: list[Message]) -> Completion:
        return Completion(text="ok", completion_tokens=1)

    async def close(self) -> None:
        return None


def use_fake_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "PolicyClient", FakePolicy)


def write_tasks(data: Path, n: int) -> Path:
    path = data / "tasks.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "task_name": f"q{i}"}) + "\n" for i in range(n)))
    return path


def rollout_config(root: Path, rank: int, rank_weights: list[float], **kw: Any) -> RolloutConfig:
    """A train rollout of iteration 2 over `root/data/tasks.jsonl` (every task), logging to `root/log`."""
    return RolloutConfig(
        data_path=str(root / "data"),
        log_path=str(root / "log"),
        iteration=2,
        rank=rank,
        rank_weights=rank_weights,
        seed=7,
        env_config=EnvConfig(train_tasks="tasks.jsonl", train_tasks_rollout_size=0, live_view="off"),
        env=OmegaConf.create({"_target_": f"{__name__}.EchoEnv"}),
        **kw,
    )
