"""One training row per episode: which selected samples can be trained as one sequence.

    plan = plan_rows(samples, stage="sft", mode="auto")
    plan.rows            # [[s0, s1, s2], [t0], ...]: each list is one dataset row, in turn order
    plan.episode_rows    # True: rows of several turns; the recipe must then set mask_history false

Each turn of an episode is sampled on the whole history before it, so one row per turn processes
that history again for every turn: the tokens an update processes grow with the square of the turns.
When the turns *chain* — turn k's prompt messages are turn k-1's, then turn k-1's reply as the assistant
message, then the new messages; and, where the ids were stored, turn k's prompt ids begin with turn k-1's
prompt and reply ids — the last turn's row already holds every earlier reply as an assistant turn, and
training all of its assistant turns (LLaMA-Factory's `mask_history: false`) trains exactly the replies the
per-turn rows would, each on the context the policy sampled it with, in one sequence.

The ids test matters: a chat template that rewrites the history (a thinking model's template dropping
earlier reasoning, images cut to the newest few) keeps the messages but not the sequence, and an
episode row would then train replies on a context the policy never saw.

`mask_history` is one setting for the whole dataset, and LLaMA-Factory's own loss has no per-turn mask, so
for rft the choice is made for the dataset: episode rows when every episode whose rows would hold an earlier
reply can become one row (its selected turns are all of turns 0..m, and they chain); otherwise one row per
turn for all, with each reason counted in `RowPlan.per_turn`. A trainer that masks the labels itself
(`masks_labels`: grpo's collator trains only the tokens the sidecar says the policy produced for the row, so
a per-turn row's earlier replies are not trained under mask_history false) decides episode by episode: the
episodes that chain become one row each, the others stay per turn, and their reasons are counted. Which
turns are trained never changes: a turn the selector left out (not drawn, an unchanged state, over
cutoff_len) is never trained by an episode row.
Only stage sft (rft, grpo) trains on episodes: a kto row's label and a dpo pair are one reply's, so those
stages keep one row per turn. Pure Python.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from rollout_engine.types import Message
from training.selection import Sample


@dataclass
class RowPlan:
    """The dataset's rows, as lists of samples (one list per row, in turn order)."""

    rows: list[list[Sample]]
    #: rows hold several trained turns (the recipe sets mask_history false)
    episode_rows: bool
    #: why episodes stayed one row per turn: reason -> episodes (all of them unless the trainer masks the labels)
    per_turn: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        turns = sum(len(row) for row in self.rows)
        why = ", ".join(f"{reason}: {n}" for reason, n in self.per_turn.items())
        why = f"; episodes that could not be one row (per turn): {why}" if why else ""
        if self.episode_rows:
            return f"one row per episode: {turns} turns in {len(self.rows)} rows" + why
        return f"one row per turn ({turns} rows)" + why

    def record(self) -> dict[str, object]:
        """selection.json's `episode_rows`."""
        return {"episode_rows": self.episode_rows, "rows": len(self.rows), "per_turn": self.per_turn}


def plan_rows(samples: list[Sample], stage: str, mode: str, masks_labels: bool = False) -> RowPlan:
    """Rows for `samples`: one per episode when `mode` is auto, the stage is sft, and every episode that holds
    an earlier reply chains (module doc); else one per turn, with the reasons counted. With `masks_labels` (the
    trainer trains only each row's own sampled tokens: grpo) the episodes that chain are one row each and the
    others per turn."""
    per_turn = [[s] for s in samples]
    if mode != "auto" or stage != "sft":
        return RowPlan(per_turn, episode_rows=False)
    episodes: dict[tuple[bool, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        episodes[(sample.demonstration, sample.episode_id)].append(sample)
    reasons: Counter[str] = Counter()
    rows: list[list[Sample]] = []
    for turns in episodes.values():
        turns.sort(key=lambda s: s.turn_index)
        episode, problem = episode_rows(turns)
        if problem:
            reasons[problem] += 1
        rows += episode or [[s] for s in turns]
    if all(len(row) == 1 for row in rows):  # no row of two turns: nothing to gain from mask_history false
        return RowPlan(per_turn, episode_rows=False, per_turn=dict(reasons))
    if reasons and not masks_labels:
        return RowPlan(per_turn, episode_rows=False, per_turn=dict(reasons))
    return RowPlan(rows, episode_rows=True, per_turn=dict(reasons))


def episode_rows(turns: list[Sample]) -> tuple[list[list[Sample]], str]:
    """The rows of one episode's selected turns (in turn order) under mask_history false, and "" — or no rows and
    why they cannot be one."""
    if not any(_replies_in_prompt(s.messages) for s in turns):
        return [[s] for s in turns], ""  # no prompt holds an earlier reply: each turn is its own row either way
    if [s.turn_index for s in turns] != list(range(len(turns))):
        return [], "turns_not_all_selected"  # an earlier reply in the row that is not trained today
    if _replies_in_prompt(turns[0].messages):
        return [], "replies_before_first_turn"  # assistant messages the policy did not sample
    for previous, current in itertools.pairwise(turns):
        problem = chain_problem(previous, current)
        if problem:
            return [], problem
    return [turns], ""


def chain_problem(previous: Sample, current: Sample) -> str:
    """Why `current`'s prompt does not continue `previous`'s prompt and reply; "" when it does."""
    head = len(previous.messages)
    if current.messages[:head] != previous.messages:
        return "history_rewritten"  # a windowed history, a changed system prompt, images cut to the newest
    if current.messages[head : head + 1] != [{"role": "assistant", "content": previous.response}]:
        return "reply_not_in_history"  # the environment sent back another text than the sampled reply
    prompt, reply, after = previous.prompt_token_ids, previous.completion_token_ids, current.prompt_token_ids
    if prompt is None or reply is None or after is None:
        # a demonstration has no ids (nothing was sampled); a sampled turn without them cannot show that the
        # template rendered the history as the policy saw it
        return "" if previous.demonstration else "token_ids_missing"
    if after[: len(prompt) + len(reply)] != prompt + reply:
        return "token_ids_rewritten"  # the chat template renders the history differently from the reply
    return ""


def _replies_in_prompt(messages: list[Message]) -> bool:
    return any(m.get("role") == "assistant" for m in messages)
