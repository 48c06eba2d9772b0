"""Demonstrations: the experts' replies are valid actions, and the writer's files follow the trajectory schema.

TextWorld runs for real (a generated game played by its walkthrough, about 3 s); MiniWoB++ experts are
checked on recorded snapshots here (tests/e2e/test_demonstrations.py plays them in Chromium).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine.demonstrations import SUMMARY_NAME, DemoOutcome, main, play_all
from rollout_engine.envs.actions import WebAction, parse_command, parse_web_action
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.envs.experts import ScriptedReplies
from rollout_engine.envs.miniwob_experts import SOLVERS, miniwob_expert, parse_snapshot
from rollout_engine.envs.textworld import SYSTEM_PROMPT, build_tasks
from rollout_engine.errors import EnvError
from rollout_engine.types import DEMONSTRATIONS_FILE, Message, Task, Trajectory

LOGIN = """- generic [ref=f8e1]:
  - generic [ref=f8e2]: Enter the username "keli" and the password "3hI" into the text fields and press login.
  - generic [ref=f8e4]:
    - paragraph [ref=f8e5]:
      - text: Username
      - textbox [active] [ref=f8e6]: kel
    - paragraph [ref=f8e7]:
      - text: Password
      - textbox [ref=f8e8]
    - button "Login" [ref=f8e9]"""
TABS = """- generic [ref=f12e1]:
  - generic [ref=f12e2]: "Click on Tab #3."
  - generic [ref=f12e3]:
    - tablist [ref=f12e4]:
      - tab [ref=f12e5]:
        - 'link "Tab #1" [ref=f12e6] [cursor=pointer]':
          - /url: "#tabs-1"
      - tab [ref=f12e9]:
        - 'link "Tab #3" [ref=f12e10] [cursor=pointer]':"""
CHECKBOXES = """- generic [ref=e3]:
    - checkbox "l3HK" [ref=e13]
    - checkbox "vrD" [ref=e17]
    - checkbox "YT0peP" [ref=e19]
    - button "Submit" [ref=e11]"""


def chat(goal: str, snapshots: list[str], replies: list[str]) -> list[Message]:
    """The messages MiniWobEnv sends at the step after `replies`."""
    messages: list[Message] = [{"role": "system", "content": "..."}]
    messages.append({"role": "user", "content": f"Task: {goal}\n\nPage:\n{snapshots[0]}"})
    for reply, snapshot in zip(replies, snapshots[1:], strict=True):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": snapshot}]
    return messages


def test_snapshot_elements_carry_role_name_and_ref() -> None:
    elements = parse_snapshot(LOGIN + "\n" + TABS)
    assert [(e.role, e.name, e.ref) for e in elements if e.role in ("textbox", "button", "link")] == [
        ("textbox", None, "f8e6"),
        ("textbox", None, "f8e8"),
        ("button", "Login", "f8e9"),
        ("link", "Tab #1", "f12e6"),
        ("link", "Tab #3", "f12e10"),
    ]


async def test_a_multi_step_page_is_solved_step_by_step_from_the_latest_snapshot() -> None:
    expert = miniwob_expert("login-user")
    assert expert is not None
    goal = 'Enter the username "keli" and the password "3hI" into the text fields and press login.'
    replies: list[str] = []
    for _ in range(3):
        replies.append((await expert.chat(chat(goal, [LOGIN] * (len(replies) + 1), replies))).text)
    assert replies == ['type(f8e6, "keli")', 'type(f8e8, "3hI")', "click(f8e9)"]
    assert [parse_web_action(r) for r in replies] == [
        WebAction("type", "f8e6", "keli"),
        WebAction("type", "f8e8", "3hI"),
        WebAction("click", "f8e9"),
    ]
    with pytest.raises(EnvError, match="3 steps of the plan did not end"):
        await expert.chat(chat(goal, [LOGIN] * 4, [*replies]))


@pytest.mark.parametrize(
    ("page", "goal", "snapshot", "want"),
    [
        ("click-tab", "Click on Tab #3.", TABS, ["click(f12e10)"]),
        ("click-checkboxes", "Select vrD, YT0peP and click Submit.", CHECKBOXES, ["click(e17)", "click(e19)"]),
        ("click-checkboxes", "Select nothing and click Submit.", CHECKBOXES, ["click(e11)"]),
        ("focus-text-2", "Focus into the 2nd input textbox.", LOGIN, ["click(f8e8)"]),
    ],
)
async def test_page_solvers_reply_with_refs_of_the_snapshot(
    page: str, goal: str, snapshot: str, want: list[str]
) -> None:
    expert = miniwob_expert(page)
    assert expert is not None
    replies: list[str] = []
    for _ in want:
        replies.append((await expert.chat(chat(goal, [snapshot] * (len(replies) + 1), replies))).text)
    assert replies == want
    assert all(parse_web_action(reply) is not None for reply in replies)


async def test_an_unknown_utterance_or_missing_element_is_an_env_error_and_unknown_pages_have_no_expert() -> None:
    assert miniwob_expert("book-flight") is None and "enter-text" in SOLVERS
    expert = miniwob_expert("click-button")
    assert expert is not None
    with pytest.raises(EnvError, match="does not match"):
        await expert.chat(chat("Press any key.", [LOGIN], []))
    with pytest.raises(EnvError, match='no button "Cancel"'):
        await expert.chat(chat('Click on the "Cancel" button.', [LOGIN], []))


async def test_scripted_replies_follow_the_script_and_fail_when_it_runs_out() -> None:
    expert = ScriptedReplies(["go east", "take key"], name="walk")
    first = await expert.chat([{"role": "user", "content": "intro"}])
    assert first.text == "go east" and first.prompt_token_ids is None and first.completion_token_ids is None
    done = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "go east"}] * 2
    with pytest.raises(EnvError, match="2 replies did not end the episode"):
        await expert.chat(done)


class OneStepEnv(Env):
    """Tasks named win-* are solved by their expert, lose-* are not, none-* have no expert."""

    name = "onestep"

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=2)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        return [{"role": "user", "content": state.task.task_name}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        return StepResult(observation=None, done=True, reward=float(reply == "win"))

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=state.turns[-1].reward, success=state.turns[-1].reward > 0)

    async def expert(self, task: Task) -> ScriptedReplies | None:
        return (
            None
            if task.task_id.startswith("none")
            else ScriptedReplies(["win"] if "win" in task.task_id else ["x"], "s")
        )


async def test_only_successful_expert_episodes_are_kept_in_task_order() -> None:
    tasks = [Task(task_id=t, task_name=t, family="f") for t in ("win-2", "lose-1", "none-1", "win-1")]
    outcome: DemoOutcome = await play_all(OneStepEnv(), tasks, slots=2, timeout_s=5)
    assert [t.task_id for t in outcome.kept] == ["win-2", "win-1"]
    assert outcome.no_expert == ["none-1"] and list(outcome.failed) == ["lose-1#0"]
    assert all(t.policy_model == "expert:s" and t.success and t.iteration == 0 for t in outcome.kept)


def test_textworld_demonstrations_are_trajectories_of_the_real_loop(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in build_tasks(2, seed=3, nb_rooms=2, nb_objects=3)))
    out = tmp_path / "demos"
    assert main(["--env", "textworld", "--tasks", str(tasks), "--out", str(out), "--data-path", str(tmp_path)]) == 0
    lines = (out / DEMONSTRATIONS_FILE).read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        row = json.loads(line)
        assert row["schema"] == "baton.trajectory/1" and row["status"] == "ok" and row["success"]
        trajectory = Trajectory.from_json(row)
        assert trajectory.to_json() == row and trajectory.policy_model == "expert:textworld-walkthrough"
        for before, turn in zip(trajectory.turns, trajectory.turns[1:], strict=False):
            assert turn.messages == [
                *before.messages,
                {"role": "assistant", "content": before.response},
                {"role": "user", "content": before.observation},
            ]
        for turn in trajectory.turns:
            assert turn.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
            assert turn.prompt_token_ids is None and turn.completion_token_ids is None
            assert parse_command(turn.response) == turn.response and turn.action["admissible"]  # type: ignore[index]
    summary = json.loads((out / SUMMARY_NAME).read_text())
    assert summary["episodes"] == summary["kept"] == 2 and summary["success_rate"] == 1.0
    assert summary["by_family"] == {"textworld-q3": {"episodes": 2, "kept": 2, "success_rate": 1.0}}


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demos"
    assert main(["--env", "textworld", "--tasks", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "--tasks" in capsys.readouterr().err
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(build_tasks(1, seed=0)[0]) + "\n")
    assert main(["--env", "chess", "--tasks", str(tasks), "--out", str(out)]) == 2
    assert "chess" in capsys.readouterr().err
    assert main(["--env", "textworld", "--tasks", str(tasks), "--out", str(out), "env.max_stepz=3"]) == 2
    assert "max_stepz" in capsys.readouterr().err
    assert not out.exists()
