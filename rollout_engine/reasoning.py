"""A thinking model's reply split into its reasoning and its answer.

Thinking models (Qwen3, DeepSeek-R1) write their reasoning before the action:
`<think>\\n...\\n</think>\\n\\nclick(e5)`. A chat template that opens `<think>` in
the generation prompt gives replies with only `...</think>click(e5)`. The
environment must see the answer alone (the reasoning often names other
actions and numbers), while the trajectory keeps the reply as sampled.

    split = split_reply(reply.text, model_config.reasoning)
    split.answer        # what the environment's parser sees
    split.reasoning     # what came before it ("" when none)

The rule, for `think` and `auto` (`none` never splits):

- the reply holds `</think>`: the answer is the text after the last one,
  leading whitespace stripped; the reasoning is everything before it;
- else the reply (stripped) starts with `<think>`: the reasoning never ended
  (cut at the token limit, usually): the answer is "", so the environment
  sees an empty reply (an invalid action, in every environment here);
- else the whole reply is the answer.

`auto` splits as `think` does: a reply without the tags is left whole, so a
model that never thinks is unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_engine.config import REASONING

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class SplitReply:
    """One reply as reasoning and answer; `reasoning + answer` may differ from the reply by the closing tag and
    the whitespace after it."""

    reasoning: str
    answer: str
    #: the reply had reasoning (closed or not): the answer is not the whole reply
    has_reasoning: bool = False


def split_reply(text: str, mode: str) -> SplitReply:
    """The answer the environment sees and the reasoning before it, by the rule of the module docstring."""
    if mode not in REASONING:
        raise ValueError(f"model_config.reasoning must be one of {', '.join(REASONING)} (got {mode!r})")
    if mode == "none":
        return SplitReply("", text)
    reasoning, closed, answer = text.rpartition(THINK_CLOSE)
    if closed:
        return SplitReply(reasoning, answer.lstrip(), has_reasoning=True)
    if text.lstrip().startswith(THINK_OPEN):
        return SplitReply(text, "", has_reasoning=True)
    return SplitReply("", text)
