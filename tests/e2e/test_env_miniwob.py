"""MiniWoB++ end to end in real headless Chromium.

Scripted correct actions prove the reward path without depending on the weak
model's luck; the real engine with the real vLLM proves the integration; and
SIGINT in the middle of a rollout must leave no browser process behind. Leaks
are found by a tag in the environment of every process the test starts (each
child inherits it), never by process name.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_engine.context import RunContext
from rollout_engine.envs.miniwob import MiniWobEnv, build_tasks
from rollout_engine.images import url_path
from rollout_engine.types import Completion, Message, Task
from tests.conftest import REPO, env_python
from tests.e2e.conftest import VllmServer
from tests.waits import run_waiting

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tagged_pids(tag: str) -> list[int]:
    """PIDs of live processes whose environment carries BATON_TEST_TAG=<tag>."""
    marker, found = f"BATON_TEST_TAG={tag}".encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def context(tmp_path: Path) -> RunContext:
    log_dir = tmp_path / "log" / "trajectories" / "test" / "iter_0000"
    return RunContext(split="test", iteration=0, rank=0, seed=0, data_path=tmp_path, log_dir=log_dir)


class ScriptedPolicy:
    """Answers each observation with a function of the last user message."""

    def __init__(self, *steps: str) -> None:
        self.steps = list(steps)

    async def chat(self, messages: list[Message]) -> Completion:
        template = self.steps.pop(0) if self.steps else 'answer("done")'
        refs = dict(re.findall(r"- (\w+)[^\n]*\[ref=(\w+)\]", messages[-1]["content"]))
        quoted = re.search(r'"([^"]+)"', messages[1]["content"])
        return Completion(text=template.format(**refs, word=quoted.group(1) if quoted else ""))


def task(name: str, index: int = 0) -> Task:
    return Task.from_json(build_tasks([name], index + 1, seed=1)[index])


async def test_scripted_actions_earn_the_page_reward(tmp_path: Path) -> None:
    env = MiniWobEnv(context=context(tmp_path), max_steps=4, screenshots=True)
    await env.start()
    try:
        click, score = await env.run_episode(task("click-test"), 0, ScriptedPolicy("click({button})"), episode_id="c#0")
        assert score.success and score.reward > 0 and score.info["page_done"]
        assert len(click.turns) == 1 and click.turns[0].state_changed and not click.turns[0].invalid_action
        image = env.context.log_dir / click.turns[0].images[0]
        assert click.turns[0].images == ["images/c#0/step_000.png"] and image.read_bytes()[:8] == PNG_MAGIC

        policy = ScriptedPolicy("click(e999)", 'type({textbox}, "{word}")', "click({button})")
        typed, score = await env.run_episode(task("enter-text"), 1, policy, episode_id="t#0")
        missing, fill, submit = typed.turns
        word = re.search(r'"([^"]+)"', typed.goal).group(1)  # type: ignore[attr-defined]
        assert missing.invalid_action and not missing.state_changed and "no element e999" in missing.observation
        assert not fill.invalid_action and fill.state_changed and fill.action["text"] == word
        assert submit.reward > 0 and score.success and typed.invalid_actions == 1
        assert env.pool.size == 2, "one browser context per slot"
    finally:
        await env.close()
    assert env.pool.browser_pid is None


async def test_a_screenshot_observation_shows_the_viewport_and_a_click_at_a_point_earns_the_reward(
    tmp_path: Path,
) -> None:
    env = MiniWobEnv(context=context(tmp_path), max_steps=2, observation="screenshot", viewport=[320, 240])
    sent: list[list[Message]] = []

    async def at_the_button(messages: list[Message]) -> Completion:  # a model that reads the screenshot well
        sent.append(messages)
        if len(sent) == 1:  # but first names an element it was never shown
            return Completion(text="click(e4)")
        box = await (await env.pool.slot(0)).page.locator("#subbtn").bounding_box()
        return Completion(text=f"click({box['x'] + box['width'] / 2:.0f}, {box['y'] + box['height'] / 2:.0f})")

    await env.start()
    try:
        policy = SimpleNamespace(chat=at_the_button)
        state, score = await env.run_episode(
            task("click-test"), 0, policy, episode_id="s#0", media_root=context(tmp_path).log_dir
        )
    finally:
        await env.close()
    # an element reference is refused where the page is shown only as a screenshot, the feedback naming the
    # actions this observation takes; the click at the button's point then earns the reward
    first, second = state.turns
    assert first.invalid_action and "only as a screenshot" in first.observation, first.observation
    assert 'click(X, Y), type(X, Y, "TEXT") or answer("TEXT")' in first.observation and "REF" not in first.observation
    assert score.success and second.action["point"]
    # the model was shown the goal and the viewport's screenshot, sent by file:// URL of the saved PNG, no tree
    image, text = sent[0][1]["content"]
    assert text["text"].startswith("Task: ") and "[ref=" not in text["text"] and "320x240" in sent[0][0]["content"]
    png = Path(url_path(image["image_url"]["url"]))
    assert png == env.context.log_dir / "images" / "s#0" / "step_000.png" and state.turns[0].images == [
        "images/s#0/step_000.png"
    ]
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and (int.from_bytes(data[16:20]), int.from_bytes(data[20:24])) == (320, 240)


async def test_wrong_answer_ends_the_episode_without_reward(tmp_path: Path) -> None:
    env = MiniWobEnv(context=context(tmp_path), max_steps=5)
    await env.start()
    try:
        state, score = await env.run_episode(task("enter-text"), 0, ScriptedPolicy('answer("no idea")'))
    finally:
        await env.close()
    assert len(state.turns) == 1 and state.turns[0].action["kind"] == "answer"
    assert not score.success and score.reward == 0.0 and score.info["answer"] == "no idea"


def engine_command(server: VllmServer, data: Path, log: Path, *overrides: str) -> list[str]:
    return [
        env_python("app"),
        "-m",
        "rollout_engine",
        "--config-name",
        "rollout_test",
        "env=miniwob",
        f"data_path={data}",
        f"log_path={log}",
        "env_config.test_tasks=tasks/miniwob.jsonl",
        "env_config.live_view=plain",
        f"policy_config.base_url={server.base_url}",
        f"policy_config.model={server.model}",
        "policy_config.max_new_tokens=24",
        *overrides,
    ]


def write_tasks(data: Path, names: list[str], per_task: int) -> list[dict]:
    rows = build_tasks(names, per_task, seed=3)
    (data / "tasks").mkdir(parents=True)
    (data / "tasks" / "miniwob.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_engine_rolls_out_miniwob_in_chromium(vllm_server: VllmServer, tmp_path: Path) -> None:
    data, log, tag = tmp_path / "data", tmp_path / "log", uuid.uuid4().hex
    rows = write_tasks(data, ["click-test", "click-button", "enter-text"], 2)
    command = engine_command(
        vllm_server, data, log, "env.max_steps=3", "env.screenshots=true", "env_config.server_size=3"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "BATON_TEST_TAG": tag}

    waiting_for = f"a MiniWoB++ rollout of {len(rows)} episodes of at most 3 steps in Chromium"
    done = run_waiting(command, waiting_for=waiting_for, timeout=600, cwd=REPO, env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert tagged_pids(tag) == [], "no Chromium or driver process outlives the engine"
    iter_dir = log / "trajectories" / "test" / "iter_0000"
    lines = [json.loads(line) for line in (iter_dir / "rank_0.jsonl").read_text().splitlines()]
    assert sorted(line["task_id"] for line in lines) == sorted(row["task_id"] for row in rows)
    for line in lines:
        assert line["status"] == "ok", line["error"]
        assert line["success"] == (line["reward"] > 0) and 1 <= len(line["turns"]) <= 3
        for turn in line["turns"]:
            assert turn["completion_token_ids"] and "[ref=" in turn["messages"][1]["content"]
            assert turn["invalid_action"] == (turn["action"] is None or turn["action"]["error"] is not None)
            assert len(turn["images"]) == 1
            assert (iter_dir / turn["images"][0]).read_bytes()[:8] == PNG_MAGIC


def test_sigint_mid_rollout_leaves_no_browser(vllm_server: VllmServer, tmp_path: Path) -> None:
    data, log, tag = tmp_path / "data", tmp_path / "log", uuid.uuid4().hex
    write_tasks(data, ["enter-text", "login-user"], 8)
    command = engine_command(vllm_server, data, log, "env.max_steps=30", "env_config.server_size=4")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BATON_TEST_TAG": tag}
    engine = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        status = log / "status.json"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and engine.poll() is None:
            counts = json.loads(status.read_text())["counts"] if status.exists() else {}
            if counts.get("generating", 0) + counts.get("env", 0) > 0:
                break
            time.sleep(0.5)
        assert engine.poll() is None, "the rollout ended before it could be interrupted"
        browsers = tagged_pids(tag)
        assert len(browsers) > 2, "Chromium is running under the engine"
        engine.send_signal(signal.SIGINT)
        _, stderr = engine.communicate(timeout=120)
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)  # the engine's own group, started above
            engine.wait()
    assert engine.returncode == 130, stderr[-3000:]
    assert tagged_pids(tag) == [], "SIGINT leaves no Chromium or driver process"
    manifest = log / "trajectories" / "test" / "iter_0000" / "rank_0.manifest.json"
    assert manifest.exists(), "what finished is sealed"
