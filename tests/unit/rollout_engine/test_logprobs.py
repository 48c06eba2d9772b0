"""The sampled tokens' log-probabilities: asked for, parsed from vLLM's reply, kept 1:1 with the token ids in the
journal (a journal written before the field still loads; one whose counts differ is refused by name)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_engine.config import PolicyConfig
from rollout_engine.errors import ConfigError, ModelError
from rollout_engine.journal import Journal, read_journal
from rollout_engine.policy import PolicyClient, parse_completion
from rollout_engine.types import Trajectory, Turn


def vllm_reply(ids: list[int] | None, logprobs: list[float] | None) -> SimpleNamespace:
    """A chat completion as the openai client parses vLLM's (return_token_ids, logprobs, top_logprobs 0)."""
    content = None if logprobs is None else [SimpleNamespace(token="t", logprob=lp, top_logprobs=[]) for lp in logprobs]
    choice = SimpleNamespace(
        message=SimpleNamespace(content="hi"),
        finish_reason="stop",
        token_ids=ids,
        logprobs=None if content is None else SimpleNamespace(content=content),
    )
    return SimpleNamespace(
        choices=[choice],
        usage=SimpleNamespace(prompt_tokens=2, completion_tokens=len(ids or [])),
        prompt_token_ids=[1, 2],
    )


def test_the_request_asks_for_the_sampled_tokens_logprobs_only_when_on() -> None:
    on = PolicyClient(PolicyConfig(), 1, client=object()).request_args([])
    assert on["logprobs"] is True and on["top_logprobs"] == 0
    off = PolicyClient(PolicyConfig(return_logprobs=False), 1, client=object()).request_args([])
    assert "logprobs" not in off and "top_logprobs" not in off


def test_logprobs_are_parsed_one_per_token_and_rounded() -> None:
    completion = parse_completion(vllm_reply([7, 8, 9], [-0.123456789, 0.0, -9999.0]))
    assert completion.completion_token_ids == [7, 8, 9]
    assert completion.completion_logprobs == [-0.123457, 0.0, -9999.0]


def test_a_reply_without_logprobs_records_none() -> None:
    assert parse_completion(vllm_reply([7, 8], None)).completion_logprobs is None


def test_logprobs_that_do_not_align_with_the_ids_are_a_model_error_never_padded() -> None:
    with pytest.raises(ModelError, match=r"completion_logprobs has 1 values for 2 completion_token_ids"):
        parse_completion(vllm_reply([7, 8], [-0.5]))
    with pytest.raises(ModelError, match=r"completion_logprobs has 1 values but completion_token_ids is null"):
        parse_completion(vllm_reply(None, [-0.5]))


def test_logprobs_without_token_ids_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"policy_config.return_logprobs needs policy_config.return_token_ids=true"):
        PolicyConfig(return_token_ids=False)
    assert PolicyConfig(return_token_ids=False, return_logprobs=False).return_logprobs is False


def trajectory(turn: Turn) -> Trajectory:
    return Trajectory(
        episode_id="t#0", task_id="t", sample_index=0, split="train", iteration=0, rank=0, env="e", family="f",
        difficulty=1, turns=[turn],
    )  # fmt: skip


def test_the_journal_keeps_the_logprobs_and_reads_a_journal_written_before_them(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    turn = Turn(index=0, messages=[], response="ab", completion_token_ids=[4, 5], completion_logprobs=[-0.25, -1.5])
    Journal(path, resume=False).append(trajectory(turn))
    old = trajectory(Turn(index=0, messages=[], response="c", completion_token_ids=[6])).to_json()
    del old["turns"][0]["completion_logprobs"]  # a line journaled before the field existed
    with path.open("a") as handle:
        handle.write(json.dumps(old) + "\n")
    new_turn, old_turn = (t.turns[0] for t in read_journal(path))
    assert new_turn.completion_logprobs == [-0.25, -1.5] and new_turn.completion_token_ids == [4, 5]
    assert old_turn.completion_logprobs is None and old_turn.completion_token_ids == [6]


def test_a_journal_line_whose_logprobs_do_not_align_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.jsonl"
    turn = Turn(index=0, messages=[], response="ab", completion_token_ids=[4, 5], completion_logprobs=[-0.25])
    path.write_text(json.dumps(trajectory(turn).to_json()) + "\n")
    with pytest.raises(ConfigError, match=r"rank_0\.jsonl:1 .*turn 0: completion_logprobs has 1 values for 2"):
        read_journal(path)
