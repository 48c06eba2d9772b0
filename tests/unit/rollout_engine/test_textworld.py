"""TextWorld env: feedback cleaning, task rows, and a scripted episode on a real generated game."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine.context import RunContext
from rollout_engine.envs.textworld import GameSpec, TextWorldEnv, build_tasks, clean_feedback
from rollout_engine.errors import ConfigError, EnvError
from rollout_engine.types import Completion, Message, Task

BANNER = (
    "\n\n\n\n                    ________  ________  __    __  ________        \n"
    "                   |        \\|        \\|  \\  |  \\|        \\       \n"
    "                    \\$$$$$$$$| $$$$$$$$| $$  | $$ \\$$$$$$$$       \n\n"
)
PROMPT = "\n\n>                                                         -= Scullery =-0/1"


def test_clean_feedback_strips_banner_prompt_and_blank_runs() -> None:
    raw = BANNER + "Your objective is to head east.\n\n\n\n-= Scullery =-\nA scullery.  " + PROMPT
    assert clean_feedback(raw) == "Your objective is to head east.\n\n-= Scullery =-\nA scullery."


def test_clean_feedback_keeps_plain_feedback_and_drops_bare_prompt() -> None:
    assert clean_feedback("\nYou pick up the key.\n\n\n\n>") == "You pick up the key."
    assert clean_feedback("") == ""


def test_build_tasks_is_deterministic_with_distinct_games() -> None:
    rows = build_tasks(5, seed=3, quest_length=2)
    assert rows == build_tasks(5, seed=3, quest_length=2)
    assert rows != build_tasks(5, seed=4, quest_length=2)
    specs = [GameSpec.from_task(Task.from_json(row)) for row in rows]
    assert len({spec.key for spec in specs}) == 5
    assert {row["difficulty"] for row in rows} == {2}
    assert json.loads(json.dumps(rows)) == rows


def _context(tmp_path: Path) -> RunContext:
    return RunContext(split="train", iteration=0, rank=0, seed=0, data_path=tmp_path, log_dir=tmp_path / "log")


@pytest.mark.parametrize("game", [None, {"nb_rooms": 2}, {"seed": "abc"}, {"seed": 1, "colour": 3}])
def test_task_without_a_valid_game_is_rejected(tmp_path: Path, game: object) -> None:
    env = TextWorldEnv(context=_context(tmp_path))
    task = Task(task_id="t1", task_name="play", metadata={"game": game})
    assert "t1" in (env.check_task(task) or "")
    with pytest.raises(EnvError, match=r"metadata\.game"):
        GameSpec.from_task(task)


def test_bad_parameters_are_config_errors_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"env.max_steps must be >= 1 .*\(got 0\)"):
        TextWorldEnv(context=_context(tmp_path), max_steps=0)


class ScriptedPolicy:
    """Replies from a fixed list, then `look`."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def chat(self, messages: list[Message]) -> Completion:
        return Completion(text=self.replies.pop(0) if self.replies else "look")


async def test_walkthrough_wins_with_score_delta_rewards(tmp_path: Path) -> None:
    env = TextWorldEnv(context=_context(tmp_path), games_dir="games", max_steps=12)
    task = Task.from_json(build_tasks(1, seed=11, quest_length=2)[0])
    spec = GameSpec.from_task(task)
    path = await env.ensure_game(spec)
    assert path == tmp_path / "games" / spec.key / "game.z8"
    walkthrough = json.loads((path.parent / "spec.json").read_text())["walkthrough"]
    assert len(walkthrough) == 2

    try:
        state, score = await env.run_episode(task, 0, ScriptedPolicy(["look", "", *walkthrough]))
    finally:
        await env.close()

    assert score.success and score.reward == 1.0 and score.info["won"]
    look, empty, *steps = state.turns
    assert look.action == {"command": "look", "admissible": True}
    assert not look.invalid_action and not look.state_changed
    assert empty.invalid_action and not empty.state_changed and state.invalid_actions == 1
    assert [turn.action["command"] for turn in steps] == [command.lower() for command in walkthrough]
    assert all(turn.state_changed for turn in steps)
    assert sum(turn.reward for turn in state.turns) == score.info["max_score"]
    assert len(state.turns) == 4, "the episode ends when the game is won"
    first_user = state.turns[0].messages[-1]["content"]
    assert "$$" not in first_user and "Available commands:" in first_user
    assert state.game is None, "teardown closes the game"


async def test_cached_game_is_reused_and_no_temp_dirs_remain(tmp_path: Path) -> None:
    env = TextWorldEnv(context=_context(tmp_path), games_dir=str(tmp_path / "abs"))
    spec = GameSpec(seed=5, nb_rooms=2, nb_objects=3, quest_length=1)
    other = TextWorldEnv(context=_context(tmp_path), games_dir=str(tmp_path / "abs"))
    try:
        first = await env.ensure_game(spec)
        stamp = first.stat().st_mtime_ns
        again = await other.ensure_game(spec)
    finally:
        await env.close()
        await other.close()
    assert again == first and again.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "abs").iterdir()] == [spec.key]


@pytest.mark.parametrize("command", ["save", "restore", "restart", "quit", "q", "script on", "recording", "replay"])
async def test_the_interpreters_own_commands_are_invalid_actions_that_touch_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The game's interpreter (frotz) answers `save` by writing game.qzl in the process's folder and `restore` by
    reading it: one episode could load another's state, and a policy could write into the user's folder."""
    monkeypatch.chdir(tmp_path)
    env = TextWorldEnv(context=_context(tmp_path), games_dir="games", max_steps=3)
    task = Task.from_json(build_tasks(1, seed=11, quest_length=2)[0])
    try:
        state, score = await env.run_episode(task, 0, ScriptedPolicy([command, "Save", "look"]))
    finally:
        await env.close()

    meta, again, look = state.turns
    assert meta.invalid_action and not meta.state_changed and meta.action == {"command": command}
    assert again.invalid_action and again.action == {"command": "save"}
    assert "interpreter" in (meta.observation or "") and not look.invalid_action
    assert state.invalid_actions == 2 and not score.success
    assert sorted(p.name for p in tmp_path.iterdir()) == ["games"]  # no game.qzl, no transcript
