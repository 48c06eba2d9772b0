"""bench/task_success.py: success per episode and per task from a real journal, and the chance of a round with
no success, computed exactly where the round is every task."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.task_success import Rates, main, parse_round
from rollout_engine.layout import Layout
from rollout_engine.types import Failure
from tests.unit.training.trajectories import traj


def journal(log: Path, trajectories: list) -> None:
    directory = Layout(log).iteration_dir("train", 1)
    directory.mkdir(parents=True)
    (directory / "rank_0.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories))


def test_a_journal_gives_the_rate_per_episode_the_tasks_by_successes_and_leaves_infrastructure_failures_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    episodes = [traj("a", i, True, iteration=1) for i in range(4)]
    episodes += [traj(task, i, False, iteration=1) for task in ("b", "c", "d") for i in range(4)]
    episodes += [traj("d", 4, True, iteration=1, status=Failure.TIMEOUT)]  # not an outcome of the policy
    journal(tmp_path, episodes)
    main(["--log-path", str(tmp_path), "--round", "4x1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "16 episodes of 4 tasks: success 25.0 % per episode"
    assert out[1] == "tasks by successes: 0: 3, 4: 1"
    # every task once: (1 - p) over the four, p shrunk by one episode at the mean: 4.25/5 and 0.25/5 (three)
    assert out[2] == f"a round of 4 tasks x 1: no success with chance {0.15 * 0.95**3:.1e}"


def test_clustered_successes_make_few_tasks_with_many_samples_likelier_to_find_none() -> None:
    rates = Rates({"a": [True] * 4, "b": [False] * 4, "c": [False] * 4, "d": [False] * 4})
    assert rates.none_in_round(4, 1) == pytest.approx(0.15 * 0.95**3)
    # one task x 4: a, 1 time in 4, else one of the three that fail
    assert rates.none_in_round(1, 4) == pytest.approx((0.15**4 + 3 * 0.95**4) / 4, abs=0.02)
    assert rates.none_in_round(1, 4) > 4 * rates.none_in_round(4, 1)


def test_a_round_is_tasks_x_samples() -> None:
    assert parse_round("96x1") == (96, 1)
    for bad in ("96", "x4", "0x4", "24x"):
        with pytest.raises(argparse.ArgumentTypeError) as caught:
            parse_round(bad)
        assert str(caught.value) == f"--round takes TASKSxSAMPLES, e.g. 24x4 (got {bad!r})"
