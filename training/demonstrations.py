"""Expert demonstrations in the update (`data.demonstrations`, docs/update.md).

    demos = demonstrations_for(cfg)        # load (training.demonstration_files) + count tokens
    add_demonstrations(selection, demos, selector, iteration=0, cutoff_len=2048, max_samples=-1, stage="sft")

Demonstrations are `baton.trajectory/1` lines written by
`python -m rollout_engine.demonstrations` (a folder holding
`demonstrations.jsonl`, or the file). Their steps go through the selector's
own step rules (unchanged state, cutoff, media placeholders) and become
`Sample`s marked `demonstration`, so the dataset code renders them like every
sampled step; they have no sampled token ids, and token fidelity skips them
and says so. A demonstration file is input: a line that does not parse is an
error, not a torn journal line. Pure Python but for `demonstrations_for`,
which loads the model's tokenizer (train environment).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Protocol

from rollout_engine.types import Failure, Message, Trajectory
from training import config as config_mod
from training.config import UpdateConfig
from training.demonstration_files import load_demonstrations
from training.selection import Selection, _Rules

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    """What `count_tokens` needs of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: list[Message], **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


def demonstrations_for(cfg: UpdateConfig) -> list[Trajectory]:
    """The demonstrations this update mixes in (none after data.demonstration_last_iteration), with token counts
    from the model's tokenizer (they have no ids; the cutoff rule needs their length)."""
    data = cfg.data
    if not data.demonstrations or 0 <= data.demonstration_last_iteration < cfg.iteration:
        return []
    demonstrations = load_demonstrations(data.demonstrations)
    from transformers import AutoTokenizer  # train environment only

    count_tokens(demonstrations, AutoTokenizer.from_pretrained(str(config_mod.model_path(cfg).resolve())))
    return demonstrations


def count_tokens(trajectories: list[Trajectory], tokenizer: Tokenizer) -> None:
    """Fill `prompt_tokens` / `completion_tokens` of turns without ids (the cutoff rule reads them)."""
    for trajectory in trajectories:
        for turn in trajectory.turns:
            if turn.prompt_token_ids is None:
                messages = [{"role": m.get("role"), "content": _text(m.get("content"))} for m in turn.messages]
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                turn.prompt_tokens = len(tokenizer.encode(str(prompt), add_special_tokens=False))
            if turn.completion_token_ids is None:
                turn.completion_tokens = len(tokenizer.encode(turn.response, add_special_tokens=False))


def add_demonstrations(
    selection: Selection,
    demonstrations: list[Trajectory],
    rules: _Rules,
    iteration: int,
    cutoff_len: int,
    max_samples: int,
    stage: str,
) -> None:
    """Add the demonstrations' trainable steps (at most `max_samples`, -1 = all) to `selection`.

    What the step rules removed is counted in `selection.filtered` as `demonstration_<rule>`.
    """
    filtered: Counter[str] = Counter()
    eligible = []
    for trajectory in demonstrations:
        if trajectory.status is not Failure.OK or not trajectory.success or not trajectory.turns:
            filtered["not_successful"] += 1
            continue
        for sample in rules.steps(trajectory, cutoff_len, filtered):
            sample.demonstration = True
            sample.iteration = iteration
            sample.label = True if stage == "kto" else None
            eligible.append(sample)
    if 0 <= max_samples < len(eligible):
        filtered["over_demonstration_samples"] += len(eligible) - max_samples
        eligible = rules.rng(iteration).sample(eligible, max_samples)
    selection.samples.extend(eligible)
    selection.demonstrations += len(eligible)
    for rule, count in filtered.items():
        selection.filtered[f"demonstration_{rule}"] = count
    log.info("demonstrations: %d steps of %d trajectories added", len(eligible), len(demonstrations))


def _text(content: Any) -> str:
    """A message's text (image parts as `<image>`), for counting tokens."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") if p.get("type") == "text" else "<image>" for p in content)
