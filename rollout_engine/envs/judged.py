"""Tasks in WebGym's JSONL schema, rewarded by an LLM judge.

Tasks carry `task_name` (the instruction), `website`, `difficulty`,
`evaluator_reference` (string, list of strings, list of `{description}`, or
fact groups `{id, description, facts}`) and `definite_answer`. There is no web
access here, so the "environment" is text: the agent answers in at most
`max_turns` turns (never more than WebGym's difficulty step budget of the
split), ending with a line `ANSWER: <answer>`; a reply without it is an
invalid action and gets a reminder; after the last turn, with
`last_reply_as_answer` (default), the last reply is judged as the answer. The judge (`rollout_engine.judge`) then
compares the answer with the reference facts and answer. A real browser
backend plugs in by overriding `setup_state` / `env_response` (as the
miniwob env does) while keeping `score`.

Episodes that never answer score 0 without a judge call; an unusable verdict
is a judge error (`Score.judge_error`), never a pass or a fail.
"""

from __future__ import annotations

import re
from typing import Any

from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.errors import ConfigError, JudgeError
from rollout_engine.judge import Judge
from rollout_engine.types import Message, Task

_ANSWER = re.compile(r"ANSWER\s*:\s*(.+)", re.IGNORECASE)

AGENT_PROMPT = (
    "You are an agent completing a task that would normally be done on a website. You have no browser: "
    "answer from what you know. End your reply with one line 'ANSWER: <your answer>'."
)
JUDGE_PROMPT = (
    "You grade an agent's answer to a task. Compare it with the reference facts and the reference answer. "
    "Explain briefly, then end with exactly one line: 'Verdict: SUCCESS' if the answer satisfies the task and "
    "agrees with the references, else 'Verdict: FAILURE'."
)


def flatten_reference(reference: Any) -> list[str]:
    """WebGym's evaluator_reference forms as a list of fact strings."""
    if reference in (None, ""):
        return []
    if isinstance(reference, str):
        return [reference]
    facts: list[str] = []
    for item in reference:
        if isinstance(item, str):
            facts.append(item)
        elif isinstance(item, dict) and "facts" in item:
            facts.extend(f"[Group {item.get('id', '')}: {item.get('description', '')}] {f}" for f in item["facts"])
        elif isinstance(item, dict):
            facts.append(str(item.get("description", "")))
    return [f for f in facts if f]


class JudgedEnv(Env):
    """Text answers to WebGym-style tasks, judged by an LLM."""

    name = "judged"

    def __init__(
        self,
        context: RunContext,
        max_turns: int = 2,
        last_reply_as_answer: bool = True,
        agent_prompt: str = AGENT_PROMPT,
        judge_prompt: str = JUDGE_PROMPT,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"env.max_turns must be >= 1 (got {max_turns})")
        self.context = context
        self.max_turns = max_turns
        self.last_reply_as_answer = last_reply_as_answer
        self.agent_prompt = agent_prompt
        self.judge_prompt = judge_prompt
        self.judge = Judge(context.judge, context.policy, "evaluation", model=context.model)

    async def close(self) -> None:
        await self.judge.close()

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=min(self.max_turns, self.context.max_steps(task)))

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        website = state.task.metadata.get("website")
        user = state.task.task_name + (f"\n(Website: {website})" if website else "")
        return [{"role": "system", "content": self.agent_prompt}, {"role": "user", "content": user}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        found = _ANSWER.findall(reply)
        if found:
            state.data["answer"] = found[-1].strip()
            return StepResult(observation=None, done=True, action={"answer": state.data["answer"]})
        return StepResult(
            observation="Give your final answer on one line: 'ANSWER: <your answer>'.",
            invalid_action=True,
            action=None,
            state_changed=False,
        )

    async def score(self, state: EpisodeState) -> Score:
        answer = state.data.get("answer")
        if answer is None and self.last_reply_as_answer and state.turns:
            answer = state.turns[-1].env_text.strip() or None  # the reply after any reasoning
        if answer is None:
            return Score(reward=0.0, success=False, info={"answer": None})
        facts = flatten_reference(state.task.metadata.get("evaluator_reference"))
        lines = [f"Task: {state.task.task_name}", f"Agent answer: {answer}"]
        lines += [f"Reference fact: {f}" for f in facts]
        if state.task.definite_answer:
            lines.append(f"Reference answer: {state.task.definite_answer}")
        messages = [{"role": "system", "content": self.judge_prompt}, {"role": "user", "content": "\n".join(lines)}]
        try:
            passed, text = await self.judge.verdict(messages)
        except JudgeError as exc:
            return Score(reward=0.0, success=False, judge_error=str(exc), info={"answer": answer})
        return Score(reward=float(passed), success=passed, info={"answer": answer, "judge": text})
