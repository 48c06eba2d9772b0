"""Where LLaMA-Factory's encoding of a row leaves the ids the policy sampled.

Shared by the token-fidelity check at each update (training.fidelity) and the
template choice before a run (training.chat_template): both encode a
conversation with LLaMA-Factory and hold it against sampled or rendered ids.
"""

from __future__ import annotations

#: LLaMA-Factory's label for a position that is not trained.
IGNORE_INDEX = -100


def split_labels(input_ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
    """(prompt ids, trained reply ids) of a supervised example: the prompt ends at the first trained label."""
    start = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
    return input_ids[:start], [t for t in labels[start:] if t != IGNORE_INDEX]


def label_runs(labels: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of trained labels: one per trained assistant turn of a supervised example (its
    reply and the template's end of turn; the next turn's prompt is not trained)."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            runs.append((start, i))
            start = None
    return runs


def split_turns(input_ids: list[int], labels: list[int]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, trained reply ids) of each trained turn of a supervised example: a turn's prompt is every
    id before its reply (the earlier turns included)."""
    return [(input_ids[:start], labels[start:end]) for start, end in label_runs(labels)]


def compare(
    prompt: list[int], reply: list[int], got_prompt: list[int], got_reply: list[int], end_of_turn: list[int]
) -> int | None:
    """First position (in prompt + reply) where LLaMA-Factory's ids leave the sampled ids, or None.

    LLaMA-Factory may add end-of-turn tokens the sampler did not emit after the reply, and nothing else."""
    want, got = prompt + reply, got_prompt + got_reply
    for position, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return position
    if len(got) < len(want):
        return len(got)
    if len(got_prompt) != len(prompt):
        return min(len(prompt), len(got_prompt))
    extra = got[len(want) :]
    if extra and extra != end_of_turn[len(end_of_turn) - len(extra) :]:
        return len(want)
    return None
