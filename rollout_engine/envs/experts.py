"""Scripted expert policies: what `Env.expert(task)` hands the episode loop to write demonstrations.

An expert is a `ChatPolicy` with a `name`: the loop sends it exactly the
messages it would send the model and gets back a reply in the environment's
own action syntax, so a demonstration's turns are the real prompts and
parseable replies. Experts report no token ids (nothing was sampled).

    expert = ScriptedReplies(["go east", "take key"], name="textworld-walkthrough")
    reply = await expert.chat(messages)    # the reply for step k = assistant turns so far

`rollout_engine.envs.miniwob_experts` has the MiniWoB++ page solvers.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_engine.errors import EnvError
from rollout_engine.types import Completion, Message


def expert_reply(text: str) -> Completion:
    """A reply written by a script: no token ids, no token counts."""
    return Completion(text=text, finish_reason="stop")


def steps_taken(messages: list[Message]) -> int:
    """How many replies the policy has given in this episode (its assistant turns)."""
    return sum(1 for message in messages if message.get("role") == "assistant")


@dataclass
class ScriptedReplies:
    """Replies a fixed script in order (TextWorld's walkthrough); running out of script is an env error."""

    replies: list[str]
    name: str

    async def chat(self, messages: list[Message]) -> Completion:
        step = steps_taken(messages)
        if step >= len(self.replies):
            raise EnvError(f"expert {self.name}: the script's {len(self.replies)} replies did not end the episode")
        return expert_reply(self.replies[step])
