"""Selection rules: rft (with per-iteration recency weighting), kto, dpo, disagreement filter."""

from __future__ import annotations

import dataclasses
from collections import Counter

from rollout_engine.types import Failure
from tests.unit.training.trajectories import traj, turn
from training.selection import DPOSelector, KTOSelector, RFTSelector, bound_images


def test_rft_keeps_successful_steps_only_and_counts_each_rule() -> None:
    trajectories = [
        traj("a", 0, True, turns=[turn(0, changed=False), turn(1, changed=False)]),  # first step unchanged
        traj("a", 1, False),
        traj("b", 0, True, status=Failure.ENV_ERROR),  # infra failure: never trained on
        traj("c", 0, True, turns=[]),
        traj("d", 0, True, turns=[turn(0, response="see <image>")]),
    ]
    selection = RFTSelector(positive_samples_to_train=100).select(trajectories, iteration=0, cutoff_len=2048)
    assert [s.source for s in selection.samples] == ["a#0@1"]  # the last step counts even if unchanged
    assert selection.filtered == {
        "infra_failed": 1,
        "empty": 1,
        "not_successful": 1,
        "unchanged_state": 1,
        "media_placeholder": 1,
    }
    assert "1 samples from 5 trajectories" in selection.describe()


def test_rft_drops_steps_over_cutoff_and_iterations_outside_the_window() -> None:
    trajectories = [traj("a", 0, True, iteration=1), traj("b", 0, True, iteration=5)]
    selection = RFTSelector(last_k_iterations=4).select(trajectories, iteration=5, cutoff_len=2048)
    assert [s.task_id for s in selection.samples] == ["b"] and selection.filtered == {"outside_window": 1}
    # 3 prompt + 2 reply ids + 2 end-of-turn tokens do not fit 6
    assert RFTSelector().select(trajectories[1:], iteration=5, cutoff_len=6).filtered == {"over_cutoff": 1}


def test_rft_recency_weight_is_per_iteration() -> None:
    selector = RFTSelector(last_k_iterations=4, recency_bias_power=2.0)
    assert [selector.weight(it, 10) for it in (7, 8, 9, 10)] == [1.0, 4.0, 9.0, 16.0]
    assert RFTSelector(recency_bias_power=0.0).weight(7, 10) == RFTSelector(recency_bias_power=0.0).weight(10, 10)


def test_rft_draw_prefers_recent_iterations_in_proportion_to_weight() -> None:
    old = [traj(f"o{i}", 0, True, iteration=3) for i in range(400)]
    new = [traj(f"n{i}", 0, True, iteration=4) for i in range(400)]
    counts: Counter[int] = Counter()
    for seed in range(20):
        chosen = (
            RFTSelector(last_k_iterations=2, positive_samples_to_train=40, recency_bias_power=2.0, seed=seed)
            .select(old + new, iteration=4, cutoff_len=2048)
            .samples
        )
        assert len(chosen) == 40 and len({s.source for s in chosen}) == 40  # without replacement
        counts.update(s.iteration for s in chosen)
    # weights 1 (iteration 3) and 4 (iteration 4): about 4:1 when the draw is small against the pool
    assert 3.0 < counts[4] / counts[3] < 5.5


def test_rft_uses_all_eligible_steps_when_fewer_than_requested() -> None:
    selection = RFTSelector(positive_samples_to_train=10).select([traj("a", 0, True)], iteration=0, cutoff_len=99)
    assert len(selection.samples) == 1


def test_rft_draws_no_own_step_when_asked_for_none() -> None:
    # positive_samples_to_train=0: an update on demonstrations alone (the agent bench's control arm)
    selection = RFTSelector(positive_samples_to_train=0).select([traj("a", 0, True)], iteration=0, cutoff_len=99)
    assert selection.samples == []


def reply(tokens: int) -> list:
    t = turn()
    t.completion_token_ids = list(range(tokens))
    return [t]


def test_rft_shortest_per_task_keeps_the_shortest_successes_of_each_task_and_iteration() -> None:
    trajectories = [
        traj("a", 0, True, turns=reply(9)),
        traj("a", 1, True, turns=reply(3)),
        traj("a", 2, True, turns=reply(5)),
        traj("a", 3, False, turns=reply(1)),  # a short failure is still a failure
        traj("a", 4, True, iteration=1, turns=reply(30)),  # another iteration: a group of its own
        traj("b", 0, True, turns=reply(7)),
        traj("b", 1, True, turns=reply(7)),  # a tie: the lower episode id wins
    ]
    chosen = RFTSelector(shortest_per_task=1).select(trajectories, iteration=1, cutoff_len=2048)
    assert sorted(s.episode_id for s in chosen.samples) == ["a#1", "a#4", "b#0"]
    assert chosen.filtered == {"not_successful": 1, "longer_success": 3}
    two = RFTSelector(shortest_per_task=2).select(trajectories, iteration=1, cutoff_len=2048)
    assert sorted(s.episode_id for s in two.samples) == ["a#1", "a#2", "a#4", "b#0", "b#1"]
    # off (0, the default): every success
    assert len(RFTSelector().select(trajectories, iteration=1, cutoff_len=2048).samples) == 6


def test_disagreement_filter_drops_groups_that_all_succeed_or_all_fail() -> None:
    trajectories = [
        traj("mixed", 0, True),
        traj("mixed", 1, False),
        traj("won", 0, True),
        traj("won", 1, True),
        traj("lost", 0, False),
        traj("lost", 1, False),
    ]
    selection = RFTSelector(disagreement_filter=True).select(trajectories, iteration=0, cutoff_len=2048)
    assert [s.source for s in selection.samples] == ["mixed#0@0"]
    assert selection.filtered == {"no_disagreement": 4, "not_successful": 1}


def test_kto_labels_success_desirable_and_failure_undesirable() -> None:
    selection = KTOSelector().select(
        [traj("a", 0, True), traj("a", 1, False), traj("b", 0, False, status=Failure.TIMEOUT)],
        iteration=0,
        cutoff_len=2048,
    )
    assert {(s.source, s.label) for s in selection.samples} == {("a#0@0", True), ("a#1@0", False)}
    assert selection.filtered == {"infra_failed": 1}


def test_dpo_pairs_success_with_failure_of_the_same_task_and_prompt() -> None:
    trajectories = [
        traj("a", 0, True, turns=[turn(response="7")]),
        traj("a", 1, False, turns=[turn(response="8")]),
        traj("a", 2, False, turns=[turn(response="9")]),
        traj("b", 0, True),
        traj("b", 1, True),  # no failure: no pair
        traj("c", 0, True, turns=[turn(prompt="x")]),
        traj("c", 1, False, turns=[turn(prompt="y")]),
        traj("d", 0, True, iteration=1),
        traj("d", 1, False, iteration=0),  # different iterations
    ]
    selection = DPOSelector().select(trajectories, iteration=1, cutoff_len=2048)
    pairs = [(s.source, s.rejected.source) for s in selection.samples]
    assert pairs == [("a#0@0", "a#1@0")]
    assert selection.filtered == {"no_pair": 4, "prompt_differs": 1}


def test_rft_balance_families_gives_each_family_an_equal_share_of_the_draw() -> None:
    """A family the policy rarely solves has few steps in the pool; balanced, it gets as many of the draw as a
    mastered one (while it has steps left)."""
    common = [dataclasses.replace(traj(f"c{i}", 0, True, iteration=4), family="click-test") for i in range(180)]
    rare = [dataclasses.replace(traj(f"r{i}", 0, True, iteration=4), family="click-tab") for i in range(20)]
    shares = {}
    for balance in (False, True):
        counts: Counter[str] = Counter()
        for seed in range(20):
            selector = RFTSelector(positive_samples_to_train=20, balance_families=balance, seed=seed)
            chosen = selector.select(common + rare, iteration=4, cutoff_len=2048).samples
            assert len(chosen) == 20 and len({s.source for s in chosen}) == 20
            counts.update(s.family for s in chosen)
        shares[balance] = counts["click-tab"] / 400
    # 20 of 200 steps: a tenth of the draw by default; balanced, half (1/20 weight each against 1/180)
    assert 0.05 < shares[False] < 0.16 and 0.38 < shares[True] < 0.62


def test_a_sample_whose_prompt_holds_more_images_than_max_images_per_sample_is_left_out_and_counted() -> None:
    shot = {"type": "image_url", "image_url": {"url": "file:///log/images/a%230/step_000.png"}}
    many, one = turn(0), turn(1)
    many.messages = [{"role": "user", "content": [shot, shot, shot, {"type": "text", "text": "page"}]}]
    one.messages = [{"role": "user", "content": [shot, {"type": "text", "text": "page"}]}]
    trajectories = [traj("a", 0, True, turns=[many, one])]
    selection = RFTSelector(positive_samples_to_train=100).select(trajectories, iteration=0, cutoff_len=2048)
    assert len(selection.samples) == 2
    bound_images(selection, 2)
    assert [s.source for s in selection.samples] == ["a#0@1"] and selection.filtered["too_many_images"] == 1
    bound_images(selection, 0)
    assert selection.samples == [] and selection.filtered["too_many_images"] == 2
