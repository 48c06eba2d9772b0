"""Single-turn verifiable tasks from the reasoning-gym package.

The worked example of an environment: YAML parameters plus `context` in the
constructor (which only checks and stores them), then the hooks. The prompt is
the generated question plus `prompt_suffix`; the answer is extracted from the
reply by `answer_rule` (see `rollout_engine.answers`) and scored by the
dataset's own scorer (`reasoning_gym.get_score_answer_fn`), which receives the
generated item kept in the task's `metadata.entry`. An episode succeeds when
the score reaches `success_threshold`. A reply with no answer under the rule is
an invalid action scoring 0.

    configs/env/reasoning_gym.yaml:
      _target_: rollout_engine.envs.reasoning_gym.ReasoningGymEnv
      answer_rule: tag_then_first_number
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from rollout_engine.answers import ANSWER_RULES, extract_answer
from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.errors import ConfigError
from rollout_engine.types import Message, Task

logger = logging.getLogger(__name__)


class ReasoningGymEnv(Env):
    """One question, one reply, the dataset's scorer."""

    name = "reasoning_gym"
    max_steps = 1

    def __init__(
        self,
        context: RunContext,
        answer_rule: str = "tag_then_first_number",
        success_threshold: float = 1.0,
        prompt_suffix: str = "Answer with only the final number.",
        system_prompt: str = "",
    ) -> None:
        problems = []
        if answer_rule not in ANSWER_RULES:
            problems.append(f"env.answer_rule must be one of {', '.join(ANSWER_RULES)} (got {answer_rule!r})")
        if not 0.0 < success_threshold <= 1.0:
            problems.append(f"env.success_threshold must be in (0, 1] (got {success_threshold})")
        if problems:
            raise ConfigError(problems)
        self.context = context
        self.answer_rule = answer_rule
        self.success_threshold = success_threshold
        self.prompt_suffix = prompt_suffix
        self.system_prompt = system_prompt
        self._scorer_import: asyncio.Future[Any] | None = None

    def check_task(self, task: Task) -> str | None:
        entry = task.metadata.get("entry")
        if not task.metadata.get("dataset") or not isinstance(entry, dict) or "question" not in entry:
            return "reasoning_gym tasks need metadata.dataset and metadata.entry with a question"
        return None

    async def start(self) -> None:
        # reasoning_gym takes 1-3 s to import; imported lazily inside `score` it froze the event loop (every
        # episode in flight) at the first score. Import it on a worker thread while the first replies generate.
        self._scorer_import = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "reasoning_gym"))

    async def close(self) -> None:
        if self._scorer_import is not None:
            await asyncio.gather(self._scorer_import, return_exceptions=True)

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=1)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        question = state.task.metadata["entry"]["question"]
        user = f"{question}\n{self.prompt_suffix}".strip()
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": user}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        answer = extract_answer(reply, self.answer_rule)
        state.data["answer"] = answer
        return StepResult(observation=None, done=True, invalid_action=answer is None, action={"answer": answer})

    async def score(self, state: EpisodeState) -> Score:
        answer = state.data.get("answer")
        if self._scorer_import is not None:
            await self._scorer_import
        reward = 0.0 if answer is None else _dataset_score(state.task.metadata, answer)
        return Score(reward=reward, success=reward >= self.success_threshold, info={"answer": answer})


def _dataset_score(metadata: dict[str, Any], answer: str) -> float:
    """The dataset's own score in [0, 1]; a scorer that raises scores 0 and is logged."""
    import reasoning_gym  # imported here: the package is slow to import and only this env needs it

    try:
        return float(reasoning_gym.get_score_answer_fn(metadata["dataset"])(answer, metadata["entry"]))
    except Exception:
        logger.exception("reasoning-gym scorer of %s failed on answer %r", metadata["dataset"], answer)
        return 0.0
