"""The environment's own tests, without a model: scripted replies through Baton's episode loop.

cd my_envs && PYTHONPATH=/path/to/baton $BATON_APP_PY -m pytest -q    # Baton importable, this folder too
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from my_envs.guess import BinarySearch, GuessNumberEnv, reward
from my_envs.tasks import build_tasks

from rollout_engine.context import RunContext
from rollout_engine.errors import ConfigError
from rollout_engine.types import Completion, Task


def make_env(**params: int) -> GuessNumberEnv:
    return GuessNumberEnv(RunContext("train", 1, 0, 0, Path("/data"), Path("/logs")), **params)


def guess_task(secret: int = 11, high: int = 16) -> Task:
    metadata = {"low": 1, "high": high, "secret": secret}
    return Task.from_json({"task_id": "g", "task_name": "guess", "metadata": metadata})


class Scripted:
    """A policy that says the given replies in order."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = iter(replies)

    async def chat(self, messages: list) -> Completion:
        return Completion(text=next(self.replies))


def play(env: GuessNumberEnv, task: Task, policy: object):
    return asyncio.run(env.run_episode(task, 0, policy))


def test_binary_search_wins_every_task_of_the_file_within_the_guesses() -> None:
    env = make_env()
    for row in build_tasks(30, seed=0, prefix="t"):
        task = Task.from_json(row)
        assert env.check_task(task) is None
        state, score = play(env, task, BinarySearch(1, task.metadata["high"]))
        assert score.success and score.reward >= 0.5 and len(state.turns) <= 6, (row, state.turns)


def test_higher_lower_an_invalid_reply_and_the_reward() -> None:
    state, score = play(make_env(max_guesses=4), guess_task(secret=11), Scripted(["8", "twelve?", "12", "11"]))
    assert [t.observation for t in state.turns] == [
        "Higher.",
        "Reply with one whole number from 1 to 16.",
        "Lower.",
        "Correct!",
    ]
    assert [t.invalid_action for t in state.turns] == [False, True, False, False]
    assert score.success and score.reward == reward(True, 3, 4) and score.info["guesses"] == 3


def test_running_out_of_guesses_scores_zero() -> None:
    state, score = play(make_env(max_guesses=2), guess_task(secret=11), Scripted(["1", "2"]))
    assert not score.success and score.reward == 0.0 and len(state.turns) == 2


def test_reward_falls_from_one_to_a_half_over_the_guesses() -> None:
    assert (reward(True, 1, 6), reward(True, 6, 6), reward(False, 6, 6)) == (1.0, 0.5, 0.0)


def test_check_task_and_the_constructor_refuse_bad_input() -> None:
    assert "metadata.low <= secret <= high" in make_env().check_task(guess_task(secret=20))
    with pytest.raises(ConfigError, match=r"env.max_guesses must be >= 1 \(got 0\)"):
        make_env(max_guesses=0)
