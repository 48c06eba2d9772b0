"""--keep-best's decision (coordinator/keep_best.py) on canned metrics.jsonl rows."""

from __future__ import annotations

import pytest

from coordinator.keep_best import decide


def held_out(iteration: int, rate: float, version: int | None, episodes: int = 40) -> dict:
    return {
        "kind": "rollout",
        "split": "test",
        "iteration": iteration,
        "policy_version": version,
        "success_rate": rate,
        "ok_episodes": episodes,
    }


def every(_version: int) -> bool:
    return True


def test_no_held_out_this_iteration_decides_nothing() -> None:
    rows = [held_out(1, 0.1, None), {"kind": "rollout", "split": "train", "iteration": 2, "success_rate": 0.5}]
    assert decide(rows, 2, 0.0, every).action == "none"


def test_the_first_measurement_keeps_the_served_policy() -> None:
    decision = decide([held_out(1, 0.1, None)], 1, 0.0, every)
    assert (decision.action, decision.served, decision.best) == ("keep", 0, 0)
    assert decision.message() == ""


def test_a_worse_policy_is_replaced_by_the_best() -> None:
    rows = [held_out(1, 0.1, None), held_out(3, 0.2, 2), held_out(5, 0.125, 4)]
    decision = decide(rows, 5, 0.0, every)
    assert (decision.action, decision.served, decision.best, decision.source) == ("revert", 4, 2, 2)
    assert decision.message() == "held-out 12.5 % for v4 < 20.0 % for v2 (best): serving v2 again"


def test_a_tie_keeps_the_served_policy() -> None:
    rows = [held_out(3, 0.2, 2), held_out(5, 0.2, 4)]
    assert decide(rows, 5, 0.0, every).action == "keep"


def test_a_better_policy_is_kept() -> None:
    rows = [held_out(3, 0.2, 2), held_out(5, 0.3, 4)]
    decision = decide(rows, 5, 0.0, every)
    assert (decision.action, decision.best) == ("keep", 4)


@pytest.mark.parametrize(("margin", "action"), [(5.0, "revert"), (7.4, "revert"), (7.5, "keep"), (10.0, "keep")])
def test_the_margin_in_points(margin: float, action: str) -> None:
    rows = [held_out(3, 0.2, 2), held_out(5, 0.125, 4)]  # 7.5 points below the best
    decision = decide(rows, 5, margin, every)
    assert decision.action == action
    if action == "keep":
        assert "within" in decision.message() and "keeping v4" in decision.message()


def test_the_base_model_may_be_the_best() -> None:
    rows = [held_out(1, 0.3, None), held_out(2, 0.1, 1)]
    decision = decide(rows, 2, 0.0, lambda v: False)  # no folder needed for the base model
    assert (decision.action, decision.best, decision.source) == ("revert", 0, 0)
    assert decision.message().endswith("10.0 % for v1 < 30.0 % for the base model (best): serving the base model again")


def test_several_measurements_of_a_policy_are_pooled_by_episodes() -> None:
    # v2: 0.4 on 10 episodes, then 0.1 on 30: pooled 0.175 < v3's 0.2 -> v3 is the best (the latest alone would say 0.1)
    rows = [held_out(2, 0.4, 2, 10), held_out(3, 0.1, 2, 30), held_out(4, 0.2, 3, 40)]
    decision = decide(rows, 4, 0.0, every)
    assert (decision.action, decision.best, decision.best_rate) == ("keep", 3, 0.2)
    assert decision.served_rate == pytest.approx(0.2)


def test_a_revert_copy_counts_as_its_original() -> None:
    rows = [
        held_out(3, 0.2, 2),
        held_out(5, 0.125, 4),
        {"kind": "revert", "iteration": 5, "policy_version": 5, "reverted_to": 2},
        held_out(6, 0.2, 5),  # v5 holds v2's weights: v2 pooled 0.2, served == best
    ]
    decision = decide(rows, 6, 0.0, every)
    assert (decision.action, decision.served, decision.best) == ("keep", 5, 2)
    assert decide(rows, 6, 0.0, lambda v: v == 5).source == 5  # v2 pruned: its copy is the folder


def test_a_pruned_best_is_no_candidate() -> None:
    rows = [held_out(2, 0.5, 1), held_out(3, 0.2, 2), held_out(4, 0.1, 3)]
    decision = decide(rows, 4, 0.0, lambda v: v != 1)
    assert (decision.action, decision.best) == ("revert", 2)


def test_a_resumed_iteration_that_reverted_is_done() -> None:
    rows = [
        held_out(3, 0.2, 2),
        held_out(5, 0.125, 4),
        {"kind": "revert", "iteration": 5, "policy_version": 5, "reverted_to": 2},
    ]
    decision = decide(rows, 5, 0.0, every)
    assert (decision.action, decision.reverted_as) == ("done", 5)


def test_the_last_record_of_a_restarted_iteration_counts() -> None:
    rows = [held_out(3, 0.2, 2), held_out(5, 0.1, 4), held_out(5, 0.3, 4)]
    assert decide(rows, 5, 0.0, every).action == "keep"
