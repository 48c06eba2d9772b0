"""One row per episode (training.episodes): when turns chain, which rows are written, what they train, the
sidecar's turns, and how the token-fidelity check and the policy-gradient columns read a row of several turns.

The episode below is ChatML-like with made-up ids: <s>=1, <|im_end|>=2, "\\n"=3, user header 8, assistant header 9.
Turn 0's prompt is [1, 8, 20, 2, 3, 9]; it samples [30, 31, 2]; the environment answers with user text 21, so
turn 1's prompt is turn 0's prompt and reply, the template's "\\n", then [8, 21, 2, 3, 9]; turn 1 samples [32, 2].
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine.errors import ConfigError
from training import fidelity
from training.alignment import label_runs, split_turns
from training.dataset import sampled_turns, save_dataset
from training.episodes import chain_problem, plan_rows
from training.pg_trainer import Columns, build_columns, policy_positions
from training.selection import Sample

P0 = [1, 8, 20, 2, 3, 9]
C0 = [30, 31, 2]
P1 = [*P0, *C0, 3, 8, 21, 2, 3, 9]
C1 = [32, 2]
SYSTEM = {"role": "system", "content": "play"}
M0 = [SYSTEM, {"role": "user", "content": "room A"}]
M1 = [*M0, {"role": "assistant", "content": "go east"}, {"role": "user", "content": "room B"}]


def step(index: int, episode: str = "t#0", **kw) -> Sample:
    base = {
        0: {"messages": M0, "response": "go east", "prompt_token_ids": P0, "completion_token_ids": C0,
            "completion_logprobs": [-0.1, -0.2, -0.3]},
        1: {"messages": M1, "response": "take key", "prompt_token_ids": P1, "completion_token_ids": C1,
            "completion_logprobs": [-0.4, -0.5]},
    }[index]  # fmt: skip
    return Sample(episode_id=episode, task_id="t", iteration=0, turn_index=index, **{**base, **kw})


def test_turns_chain_when_the_prompt_extends_the_previous_prompt_and_reply() -> None:
    assert chain_problem(step(0), step(1)) == ""
    windowed = step(1, messages=[SYSTEM, *M1[2:]])  # the history cut to the last turns
    assert chain_problem(step(0), windowed) == "history_rewritten"
    assert chain_problem(step(0), step(1, messages=[{"role": "system", "content": "new"}, *M1[1:]])) == (
        "history_rewritten"
    )
    stripped = step(1, messages=[*M0, {"role": "assistant", "content": "east"}, M1[3]])  # the env's parsed action
    assert chain_problem(step(0), stripped) == "reply_not_in_history"
    # same messages, but the template rendered the history otherwise (a thinking model's reasoning dropped)
    assert chain_problem(step(0), step(1, prompt_token_ids=[*P0, 31, 2, 3, 8, 21, 2, 3, 9])) == "token_ids_rewritten"
    assert chain_problem(step(0), step(1, prompt_token_ids=None)) == "token_ids_missing"
    demo = {"demonstration": True, "prompt_token_ids": None, "completion_token_ids": None, "completion_logprobs": None}
    assert chain_problem(step(0, **demo), step(1, **demo)) == ""  # nothing sampled: the messages decide


def test_a_chained_episode_is_one_row_that_trains_exactly_the_per_turn_replies(tmp_path: Path) -> None:
    samples = [step(1), step(0), step(0, episode="u#0")]  # a single-turn episode beside a two-turn one
    plan = plan_rows(samples, "sft", "auto")
    assert plan.episode_rows and sorted(len(row) for row in plan.rows) == [1, 2]
    files = save_dataset(plan, tmp_path / "ep", "sft")
    per_turn = save_dataset(samples, tmp_path / "turn", "sft")
    assert (files.train_rows, files.episode_rows) == (2, True) and (per_turn.train_rows, per_turn.episode_rows) == (
        3,
        False,
    )
    rows = json.loads((tmp_path / "ep" / "train.json").read_text())
    (episode,) = [r for r in rows if len(r["conversations"]) > 2]
    trained = [t["value"] for t in episode["conversations"] if t["from"] == "gpt"]  # mask_history false: all
    per_turn_rows = json.loads((tmp_path / "turn" / "train.json").read_text())
    replies = [r["conversations"][-1]["value"] for r in per_turn_rows if r["conversations"][0]["value"] == "room A"]
    assert sorted(trained) == sorted(replies[:2]) == ["go east", "take key"]
    sidecar = [json.loads(line) for line in (tmp_path / "ep" / "train.token_ids.jsonl").read_text().splitlines()]
    (ids,) = [r for r in sidecar if "turns" in r]
    assert ids["source"] == "t#0@0..1" and ids["turns"][1]["new_prompt_token_ids"] == [3, 8, 21, 2, 3, 9]
    turns = sampled_turns(ids)  # the whole prompt of each turn comes back, as the policy saw it
    assert [(t.prompt_token_ids, t.completion_token_ids) for t in turns] == [(P0, C0), (P1, C1)]
    assert turns[1].completion_logprobs == [-0.4, -0.5] and turns[1].source == "t#0@1"
    old = {"source": "t#0@0", "prompt_token_ids": P0, "completion_token_ids": C0, "completion_logprobs": None}
    assert [t.prompt_token_ids for t in sampled_turns(old)] == [P0]  # a row written before episode rows


def test_an_episode_that_cannot_be_one_row_keeps_every_row_per_turn_and_says_why() -> None:
    broken = [step(0), step(1), step(0, episode="v#0"), step(1, episode="v#0", messages=[SYSTEM, *M1[2:]])]
    plan = plan_rows(broken, "sft", "auto")
    assert not plan.episode_rows and len(plan.rows) == 4 and plan.per_turn == {"history_rewritten": 1}
    assert "history_rewritten: 1" in plan.describe()
    # grpo's collator trains only each row's own sampled tokens: the episode that chains is one row, the other
    # stays per turn (its first turn's reply is history in its second row, and not trained there)
    mixed = plan_rows(broken, "sft", "auto", masks_labels=True)
    assert mixed.episode_rows and sorted(len(row) for row in mixed.rows) == [1, 1, 2]
    assert mixed.per_turn == {"history_rewritten": 1} and "3 rows; episodes that could not" in mixed.describe()
    # a turn the selector left out (not drawn, state unchanged) would be trained as history: per turn
    assert plan_rows([step(1)], "sft", "auto").per_turn == {"turns_not_all_selected": 1}
    assert not plan_rows([step(0), step(1)], "sft", "per_turn").episode_rows
    assert not plan_rows([step(0), step(1)], "kto", "auto").episode_rows  # a kto label is one reply's
    # no prompt holds an earlier reply: nothing to merge, and no reason to leave mask_history on
    fresh = plan_rows([step(0), step(0, episode="u#0")], "sft", "auto")
    assert not fresh.episode_rows and fresh.per_turn == {}


def test_label_runs_split_an_encoded_episode_into_its_trained_turns() -> None:
    labels = [-100] * 6 + [30, 31, 2, 3] + [-100] * 5 + [32, 2, 3]  # each reply with the template's end of turn
    ids = [*P1, 32, 2, 3]
    assert label_runs(labels) == [(6, 10), (15, 18)]
    assert split_turns(ids, labels) == [(P0, [30, 31, 2, 3]), (P1, [32, 2, 3])]


def test_grpo_columns_align_each_turns_logprobs_and_mask_each_end_of_turn(tmp_path: Path) -> None:
    row = {**_sidecar(tmp_path)[0], "advantage": 0.5}
    labels = [-100] * 6 + [30, 31, 2, 3] + [-100] * 5 + [32, 2, 3]
    columns = build_columns([labels], [row], tmp_path / "train.token_ids.jsonl")
    # two turns: 3 then 2 policy tokens; their log-probabilities one after the other
    assert columns == Columns([0.5], [[3, 2]], [[-0.1, -0.2, -0.3, -0.4, -0.5]])
    # the template's "\n" after each <|im_end|> (positions 9 and 17) is not the policy's
    assert policy_positions(labels, [3, 2]) == [6, 7, 8, 15, 16]
    assert policy_positions(labels, [-1]) == [6, 7, 8, 9, 15, 16, 17]
    # a per-turn row trained under mask_history false: its history reply is masked, its own reply trained
    single = {"source": "t#0@1", "completion_token_ids": C1, "completion_logprobs": [-0.4, -0.5], "advantage": 1.0}
    assert build_columns([labels], [single], tmp_path / "x").policy_tokens == [[0, 2]]
    with pytest.raises(ValueError, match=r"LLaMA-Factory's trained tokens of t#0@1 are not its sampled"):
        build_columns([[*labels[:-3], 33, 2, 3]], [row], tmp_path / "x")
    with pytest.raises(ValueError, match="holds 2 sampled replies but LLaMA-Factory trains 1 turns"):
        build_columns([[-100] * 6 + [30, 31, 2, 3]], [row], tmp_path / "x")


def _sidecar(tmp_path: Path) -> list[dict]:
    save_dataset(plan_rows([step(0), step(1)], "sft", "auto"), tmp_path, "sft")
    return [json.loads(line) for line in (tmp_path / "train.token_ids.jsonl").read_text().splitlines()]


class _Encoder:
    """LLaMA-Factory's encoding of the episode row, stood in by hand: every turn trained, "\\n" after <|im_end|>."""

    def __init__(self, second_reply: list[int]) -> None:
        self.second_reply = second_reply

    def encode(self, row: dict) -> list[tuple[list[int], list[int]]]:
        return [(P0, [*C0, 3]), (P1, [*self.second_reply, 3])]

    def end_of_turn(self) -> list[int]:
        return [2, 3]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    decode_text = decode

    def image_token(self) -> None:
        return None


def test_token_fidelity_compares_every_turn_of_an_episode_row(tmp_path: Path, monkeypatch) -> None:
    _sidecar(tmp_path)
    recipe = {"dataset_dir": str(tmp_path), "template": "qwen", "mask_history": False, "cutoff_len": 64}
    monkeypatch.setattr(fidelity, "_load", lambda recipe, name: (_Encoder(C1), [{}]))
    report = fidelity.check_fidelity(recipe, samples=-1)
    assert (report.rows, report.checked, report.noncanonical) == (1, 1, [])
    monkeypatch.setattr(fidelity, "_load", lambda recipe, name: (_Encoder([33, 2]), [{}]))  # turn 1 differs
    with pytest.raises(ConfigError, match=r"row 0 \(t#0@0\.\.1\) differs from the sampled ids at position 15"):
        fidelity.check_fidelity(recipe, samples=-1)
    monkeypatch.setattr(fidelity, "_load", lambda recipe, name: (_Encoder(C1), [{}]))
    monkeypatch.setattr(_Encoder, "encode", lambda self, row: [(P0, [*C0, 3])])  # cutoff_len dropped turn 1
    with pytest.raises(ConfigError, match="holds 2 sampled replies but LLaMA-Factory trains 1 turns"):
        fidelity.check_fidelity(recipe, samples=-1)
