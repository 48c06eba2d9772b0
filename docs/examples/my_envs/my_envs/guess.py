"""Guess the number: the model guesses, the environment answers higher or lower, until it is found.

    bash scripts/run.sh ... env=custom env._target_=my_envs.guess.GuessNumberEnv \
        env_config.python_path=[/abs/path/to/my_envs]    # the folder that holds my_envs/

A task names the secret and its range: {"task_id": "g-0", "task_name": "Guess 1..16",
"difficulty": 2, "metadata": {"low": 1, "high": 16, "secret": 11}} (my_envs/tasks.py writes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.errors import ConfigError
from rollout_engine.types import Completion, Message, Task

NUMBER = re.compile(r"-?\d+")


def reward(won: bool, guesses: int, max_guesses: int) -> float:
    """1 for a win at the first guess, down to 0.5 at the last; 0 when the guesses ran out."""
    return 1.0 - 0.5 * (guesses - 1) / max(max_guesses - 1, 1) if won else 0.0


@dataclass
class GuessState(EpisodeState):
    low: int = 1
    high: int = 1
    secret: int = 1
    guesses: list[int] = field(default_factory=list)
    won: bool = False


class GuessNumberEnv(Env):
    """Multi-turn: one number per reply, "Higher." or "Lower." back, `max_guesses` tries."""

    name = "guess"

    def __init__(self, context: RunContext, max_guesses: int = 6) -> None:
        if max_guesses < 1:  # the constructor only checks and stores: errors name env.<key>, the value, the fix
            raise ConfigError(f"env.max_guesses must be >= 1 (got {max_guesses}); give the guesses an episode gets")
        self.context, self.max_guesses = context, max_guesses

    def check_task(self, task: Task) -> str | None:
        low, high, secret = (task.metadata.get(k) for k in ("low", "high", "secret"))
        if not all(isinstance(v, int) for v in (low, high, secret)) or not low <= secret <= high:
            return f"guess tasks need whole numbers metadata.low <= secret <= high (got {low}, {secret}, {high})"
        return None

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        m = task.metadata
        return GuessState(task, slot, self.max_guesses, low=m["low"], high=m["high"], secret=m["secret"])

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        assert isinstance(state, GuessState)
        text = (
            f"I am thinking of a whole number from {state.low} to {state.high}. Guess it: reply with one number "
            f"only. After each guess I say higher or lower. You have {self.max_guesses} guesses."
        )
        return [{"role": "user", "content": text}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        assert isinstance(state, GuessState)
        found = NUMBER.search(reply)
        if found is None:
            return StepResult(f"Reply with one whole number from {state.low} to {state.high}.", invalid_action=True)
        guess = int(found.group())
        state.guesses.append(guess)
        state.won = guess == state.secret
        answer = "Correct!" if state.won else "Higher." if guess < state.secret else "Lower."
        return StepResult(answer, done=state.won, action={"guess": guess})

    async def score(self, state: EpisodeState) -> Score:
        assert isinstance(state, GuessState)
        value = reward(state.won, len(state.guesses), self.max_guesses)
        return Score(value, state.won, info={"guesses": len(state.guesses), "secret": state.secret})

    async def expert(self, task: Task) -> BinarySearch:
        return BinarySearch(task.metadata["low"], task.metadata["high"])


@dataclass
class BinarySearch:
    """The expert (demonstrations, tests): halve the range after each answer."""

    low: int
    high: int
    name: str = "binary-search"
    guess: int = 0

    async def chat(self, messages: list[Message]) -> Completion:
        answer = messages[-1]["content"]
        if len(messages) > 1 and answer.startswith(("Higher", "Lower")):
            self.low, self.high = (self.guess + 1, self.high) if answer == "Higher." else (self.low, self.guess - 1)
        self.guess = (self.low + self.high) // 2
        return Completion(text=str(self.guess))
