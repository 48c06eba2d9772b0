"""The policy-gradient loss of algorithm=grpo against a hand-computed example (training.pg_loss, pg_trainer's
collator), run in the train environment by pg_cases.py (its docstring: the inputs); the columns that carry each
row's advantage and behaviour log-probabilities onto its sampled tokens (pg_trainer.build_columns).

Sequence 0 (advantage +1), ratios 1.5, 0.5, 1.0:  per-token loss -min(r A, clip(r, 0.8, 1.28) A)
    1.5 -> -min(1.5, 1.28) = -1.28 (clipped high: no gradient), 0.5 -> -min(0.5, 0.8) = -0.5, 1.0 -> -1.0
Sequence 1 (advantage -1), ratios 0.5, 1.2:
    0.5 -> -min(-0.5, -0.8) = 0.8 (clipped low: no gradient), 1.2 -> -min(-1.2, -1.2) = 1.2
d(-r A)/d logp = -r A where the unclipped term is the minimum.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, env_python
from training.pg_trainer import Columns, build_columns

TOKENS = 5
SEQ0 = [-1.28, -0.5, -1.0]
SEQ1 = [0.8, 1.2]


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


@pytest.fixture(scope="module")
def cases() -> dict:
    out = subprocess.run(
        [env_python("train"), str(REPO / "tests/unit/training/pg_cases.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_token_mean_clips_both_sides_and_ignores_untrained_positions(cases: dict) -> None:
    got = cases["token_mean"]
    assert got["loss"] == pytest.approx((sum(SEQ0) + sum(SEQ1)) / TOKENS)
    # clipped tokens give no gradient; the untrained 4th position of sequence 0 (ratio e^45 were it counted) none
    assert flat(got["grad"]) == pytest.approx([0.0, -0.5 / TOKENS, -1.0 / TOKENS, 0.0, 0.0, 1.2 / TOKENS, 0.0, 0.0])
    assert got["stats"] == pytest.approx(
        {"tokens": 5, "clipped_low": 1, "clipped_high": 1, "ratio": 1.5 + 0.5 + 1.0 + 0.5 + 1.2, "kl": 0}
    )


def test_token_mean_divides_by_the_optimizer_steps_tokens(cases: dict) -> None:
    """Under gradient accumulation the trainer passes the step's token count: every token weighs the same."""
    got = cases["token_mean_step"]
    assert got["loss"] == pytest.approx((sum(SEQ0) + sum(SEQ1)) / 10)
    assert got["grad"][1][1] == pytest.approx(1.2 / 10)


def test_importance_weights_scale_each_tokens_term_and_its_gradient(cases: dict) -> None:
    """old_logprobs=trainer: each token's term times its truncated importance weight (2, 0.5, 1 | 1, 1.5); the
    clipped tokens still give no gradient, the untrained position's weight (99) changes nothing."""
    got = cases["weighted"]
    weighted = 2.0 * SEQ0[0] + 0.5 * SEQ0[1] + SEQ0[2] + SEQ1[0] + 1.5 * SEQ1[1]
    assert got["loss"] == pytest.approx(weighted / TOKENS)
    grad = [0.0, 0.5 * -0.5 / TOKENS, -1.0 / TOKENS, 0.0, 0.0, 1.5 * 1.2 / TOKENS, 0.0, 0.0]
    assert flat(got["grad"]) == pytest.approx(grad)
    assert got["stats"]["ratio"] == pytest.approx(1.5 + 0.5 + 1.0 + 0.5 + 1.2)  # the ratio itself is not weighed


def test_sequence_mean_averages_each_sequence_first(cases: dict) -> None:
    got = cases["sequence_mean"]
    assert got["loss"] == pytest.approx((sum(SEQ0) / 3 + sum(SEQ1) / 2) / 2)
    assert flat(got["grad"]) == pytest.approx([0.0, -0.5 / 3 / 2, -1.0 / 3 / 2, 0.0, 0.0, 1.2 / 2 / 2, 0.0, 0.0])


def test_kl_term_is_the_k3_estimate_to_the_reference(cases: dict) -> None:
    """ref - logp = log 2 at one token: k3 = e^d - d - 1 = 1 - log 2; its gradient beta (1 - e^d) / tokens."""
    got = cases["kl"]
    k3 = 2.0 - math.log(2.0) - 1.0
    assert got["stats"]["kl"] == pytest.approx(k3)
    assert got["loss"] == pytest.approx((sum(SEQ0) + sum(SEQ1) + 0.1 * k3) / TOKENS)
    assert got["grad"][0][0] == pytest.approx(0.1 * (1.0 - 2.0) / TOKENS)  # the clipped token: the KL's alone


def test_kl_term_is_bounded_where_the_policy_fell_far_below_the_reference(cases: dict) -> None:
    """exp(ref - logp) is unbounded: a token 30 nats below its reference would add e^30 to the loss."""
    assert cases["kl_bound"] == pytest.approx({"loss": 10.0, "kl": 10.0, "grad": 0.0})


def test_token_logprobs_are_the_shifted_log_softmax_of_the_trained_labels(cases: dict) -> None:
    got = cases["logprobs"]
    lse = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert got["mask"] == [[True, True, False]]
    assert flat(got["logp"]) == pytest.approx([3.0 - lse, -math.log(3.0), 0.0], abs=1e-6)


def test_collator_trains_only_the_sampled_tokens_and_aligns_their_logprobs(cases: dict) -> None:
    got = cases["collator"]
    # the template's 198 after the sampled <|im_end|> is not trained; a row without sampled ids keeps its labels
    assert got["labels"] == [[-100, -100, 5, 6, 2, -100], [-100, 7, 2, 198, -100, -100]]
    assert got["pg_behaviour"][0][2:5] == pytest.approx([-0.1, -0.2, -0.3])
    assert got["pg_has_behaviour"] == [True, False]
    assert got["pg_advantages"] == [0.5, -0.5]
    assert got["pg_rows"] == [7, 3]  # each row's index in the dataset: its recomputed old log-probabilities' key
    assert "pg_logprobs" not in got and "pg_policy_tokens" not in got  # taken out before LLaMA-Factory's collator
    assert "pg_row" not in got


def test_collator_trains_each_turn_of_an_episode_row_with_its_own_logprobs(cases: dict) -> None:
    got = cases["episode_collator"]
    assert got["labels"] == [[-100, 5, 2, -100, -100, 6, 7, 2, -100]]
    assert got["pg_behaviour"][0] == pytest.approx([0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5, 0.0])


def test_columns_put_each_rows_advantage_and_logprobs_on_its_sampled_tokens(tmp_path: Path) -> None:
    """build_columns (app environment): the rows must be the encoded dataset's, one for one, token for token."""
    sidecar = tmp_path / "train.token_ids.jsonl"
    labels = [[-100, -100, 5, 6, 2, 198], [-100, 7, 2, 198]]
    rows = [
        {"source": "a#0@0", "completion_token_ids": [5, 6, 2], "completion_logprobs": [-0.1, -0.2, -0.3],
         "advantage": 0.5},
        {"source": "a#1@0", "completion_token_ids": None, "advantage": -0.5},
    ]  # fmt: skip
    columns = build_columns(labels, rows, sidecar)
    assert columns == Columns([0.5, -0.5], [[3], [-1]], [[-0.1, -0.2, -0.3], []]) and columns.without_logprobs == 1
    with pytest.raises(ValueError, match="has 1 rows but LLaMA-Factory encoded 2"):
        build_columns(labels, rows[:1], sidecar)
    with pytest.raises(
        ValueError, match=r"row 0 \(a#0@0\): LLaMA-Factory's trained tokens of a#0@0 are not its sampled"
    ):
        build_columns(labels, [{**rows[0], "completion_token_ids": [5, 7, 2]}, rows[1]], sidecar)
    with pytest.raises(ValueError, match="has 2 completion_logprobs for 3 completion_token_ids"):
        build_columns(labels, [{**rows[0], "completion_logprobs": [-0.1, -0.2]}, rows[1]], sidecar)
    with pytest.raises(ValueError, match=r"row 1 .* has no advantage: prepare the data with algorithm=grpo"):
        build_columns(labels, [rows[0], {"source": "a#1@0", "completion_token_ids": None}], sidecar)


@pytest.mark.parametrize("case", ["sampler_one", "sampler_two"])
def test_old_logprobs_rescore_exactly_the_rows_the_steps_reach(cases: dict, case: str) -> None:
    """old_logprobs=trainer rescores before the first step only the rows the update's steps will train (max_steps
    can end it after a few of many): foreseen from accelerate's seeded sampler, the same rows on every process."""
    foreseen = cases[case]["foreseen"]
    assert all(rows == foreseen["0"] for rows in foreseen.values()), foreseen
    assert sorted(foreseen["0"]) == cases[case]["trained"] and len(foreseen["0"]) < 20, cases[case]


def test_old_logprobs_rescore_every_row_where_the_steps_reach_an_epoch(cases: dict) -> None:
    assert all(rows == list(range(20)) for rows in cases["sampler_epoch"]["foreseen"].values())
