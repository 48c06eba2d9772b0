"""Log-probability fidelity's bookkeeping: which replies are compared, the gap and ratio statistics, the
verdict. (The recomputation itself needs torch: tests/e2e/test_update.py runs it on a real rollout.)"""

from __future__ import annotations

import math

import pytest

from rollout_engine.errors import ConfigError
from training import logprob_check
from training.logprob_check import (
    REFUSE_MEAN_GAP,
    WARN_MEAN_GAP,
    Reply,
    compare,
    replies_of,
    trainer_dtype,
    verdict,
)


def row(source: str, ids: list[int] | None, logprobs: list[float] | None, **more) -> dict:
    base = {"source": source, "prompt_token_ids": [1, 2], "completion_token_ids": ids, "completion_logprobs": logprobs}
    return base | more


def test_replies_with_logprobs_are_compared_and_the_others_counted() -> None:
    rows = [
        row("a#0@0", [4, 5], [-0.5, -1.0]),
        row("b#0@0", [6], None),  # an old journal's step
        {"source": "demo:c#0@0", "prompt_token_ids": None, "completion_token_ids": None, "demonstration": True},
        row(
            "d#0@0",
            [7],
            [-0.25],
            rejected_source="d#1@0",
            rejected_prompt_token_ids=[1, 2],
            rejected_completion_token_ids=[8, 9],
            rejected_completion_logprobs=[-2.0, -3.0],
        ),
    ]
    replies, without = replies_of(rows)
    assert [(r.source, r.completion_ids, r.logprobs) for r in replies] == [
        ("a#0@0", [4, 5], [-0.5, -1.0]),
        ("d#0@0", [7], [-0.25]),
        ("d#1@0", [8, 9], [-2.0, -3.0]),
    ]
    assert without == 2


def test_logprobs_that_do_not_align_are_refused_by_row() -> None:
    with pytest.raises(ConfigError, match=r"a#0@0: completion_logprobs has 1 values for 2 completion_token_ids"):
        replies_of([row("a#0@0", [4, 5], [-0.5])])
    bad_rejected = row(
        "d#0@0", [7], [-0.25], rejected_source="d#1@0", rejected_prompt_token_ids=[1],
        rejected_completion_token_ids=[8, 9], rejected_completion_logprobs=[-2.0, -3.0, -1.0],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"d#1@0: rejected_completion_logprobs has 3 values for 2"):
        replies_of([bad_rejected])


def test_the_gap_and_ratio_statistics_by_hand() -> None:
    replies = [Reply("a", [1], [4, 5], [-1.0, -2.0]), Reply("b", [1], [6, 7], [-0.5, -0.1])]
    gap = compare(replies, [[-1.0, -1.5], [-0.7, -0.1]], without=3)
    # per token: new - old = 0, +0.5, -0.2, 0
    assert gap.replies == 2 and gap.tokens == 4 and gap.without_logprobs == 3
    assert gap.mean_abs_gap == pytest.approx(0.7 / 4) and gap.max_abs_gap == pytest.approx(0.5)
    assert gap.worst == "a token 1"
    ratios = [1.0, math.exp(0.5), math.exp(-0.2), 1.0]
    assert gap.ratio_mean == pytest.approx(sum(ratios) / 4)
    assert gap.ratio_min == pytest.approx(math.exp(-0.2)) and gap.ratio_max == pytest.approx(math.exp(0.5))
    assert gap.outside == pytest.approx(0.25)  # e^0.5 = 1.65 is outside [0.8, 1.2], e^-0.2 = 0.82 inside
    with pytest.raises(ValueError, match="a: 1 recomputed values for 2 recorded"):
        compare(replies[:1], [[-1.0]])


def test_the_verdict_warns_then_refuses_on_the_mean_gap() -> None:
    def gap_of(mean: float):
        return compare([Reply("a", [1], [4], [-1.0])], [[-1.0 + mean]])

    assert verdict(gap_of(0.0)) == "ok" and verdict(gap_of(WARN_MEAN_GAP / 2)) == "ok"
    assert verdict(gap_of(WARN_MEAN_GAP * 1.5)) == "warn"
    assert verdict(gap_of(REFUSE_MEAN_GAP * 1.5)) == "refuse"
    assert compare([], []).tokens == 0 and verdict(compare([], [])) == "ok"


def test_the_update_checks_in_the_precision_its_trainer_computes_in() -> None:
    assert trainer_dtype({"bf16": False}) == "float32"
    assert trainer_dtype({"bf16": True}) == "bfloat16"
    assert trainer_dtype({"bf16": False, "deepspeed": {"torch_autocast": {"enabled": True}}}) == "bfloat16"


def test_a_gap_beyond_numerics_refuses_the_update_by_name(monkeypatch, caplog, tmp_path) -> None:
    def measured(mean: float):
        return lambda *args, **kwargs: compare([Reply("a#0@0", [1], [4], [-1.0])], [[-1.0 + mean]])

    monkeypatch.setattr(logprob_check, "load_model", lambda model_dir, dtype: None)
    monkeypatch.setattr(logprob_check, "measure", measured(REFUSE_MEAN_GAP * 2))
    with pytest.raises(ConfigError, match=r"log-probability fidelity \(train, float32\).*data.logprob_samples=0"):
        logprob_check.check_logprobs(tmp_path, tmp_path)
    monkeypatch.setattr(logprob_check, "measure", measured((WARN_MEAN_GAP + REFUSE_MEAN_GAP) / 2))
    assert logprob_check.check_logprobs(tmp_path, tmp_path, dtype="bfloat16").tokens == 1
    (warned,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "log-probability fidelity (train, bfloat16)" in warned.getMessage()
