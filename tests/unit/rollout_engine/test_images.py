"""Observations with images through the episode loop: sent by file:// URL under the iteration directory, the
history keeping the newest N (older ones a text stub), the turn recording what was sent and the page seen."""

from __future__ import annotations

from pathlib import Path

from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.images import (
    STUB,
    content,
    count_images,
    images_per_prompt,
    keep_newest_images,
    url_path,
)
from rollout_engine.types import Completion, Message, Observation, Task

TASK = Task(task_id="t", task_name="t")


class Replies:
    """A scripted policy that records what it was sent."""

    def __init__(self, n: int) -> None:
        self.n, self.sent = n, []

    async def chat(self, messages: list[Message]) -> Completion:
        self.sent.append(list(messages))
        return Completion(text=f"click({len(self.sent)})", finish_reason="stop")


class ScreenEnv(Env):
    """A page shown as a screenshot and its text at every step (the file names only: nothing reads them here)."""

    name = "screen"

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=4)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        page = Observation("Task: click.\nPage 0", (f"images/{state.episode_id}/step_000.png",))
        return [{"role": "system", "content": "act"}, {"role": "user", "content": page}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        step = len(state.turns) + 1
        page = Observation(f"Page {step}", (f"images/{state.episode_id}/step_{step:03d}.png",))
        return StepResult(observation=page, done=step == 4)

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=1.0, success=True)


def image_urls(messages: list[Message]) -> list[str]:
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
    return [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]


async def test_images_go_by_file_url_and_the_history_keeps_the_newest_two(tmp_path: Path) -> None:
    root = tmp_path / "log" / "trajectories" / "train" / "iter_0001"
    policy = Replies(4)
    state, _ = await ScreenEnv().run_episode(TASK, 0, policy, episode_id="t#0", media_root=root, images_per_prompt=2)
    # every prompt holds at most 2 images, the newest ones, by file:// URL of the file under the iteration directory
    sent = [[url_path(u) for u in image_urls(m)] for m in policy.sent]
    step = [str(root / "images" / "t#0" / f"step_{k:03d}.png") for k in range(4)]
    assert sent == [[step[0]], [step[0], step[1]], [step[1], step[2]], [step[2], step[3]]]
    assert "%23" in image_urls(policy.sent[0])[0], "# in an episode id is encoded: it would end the URL's path"
    # an image left out is a short text stub, in its place; the text of every observation stays
    first_user = policy.sent[3][1]["content"]
    assert first_user == [{"type": "text", "text": STUB + "\n"}, {"type": "text", "text": "Task: click.\nPage 0"}]
    # the turn keeps the messages exactly as sent, the observation's text, and the page the model saw
    assert [t.messages for t in state.turns] == policy.sent
    assert [t.images for t in state.turns] == [[f"images/t#0/step_{k:03d}.png"] for k in range(4)]
    assert state.turns[0].observation == "Page 1"


async def test_no_image_limit_in_vllm_config_keeps_one_and_a_zero_limit_sends_text_only(tmp_path: Path) -> None:
    assert images_per_prompt({}) == 1 and images_per_prompt({"image": 3, "video": 0}) == 3
    policy = Replies(4)
    await ScreenEnv().run_episode(TASK, 0, policy, media_root=tmp_path, images_per_prompt=0)
    assert all(count_images(m) == 0 for m in policy.sent)
    assert STUB in str(policy.sent[-1])


def test_an_observation_without_images_is_plain_text_and_one_with_images_needs_its_directory(tmp_path: Path) -> None:
    assert content(Observation("just text"), None) == "just text"
    parts = content(Observation("see", ("a.png", "b.png")), tmp_path)
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    try:
        content(Observation("see", ("a.png",)), None)
    except ValueError as exc:
        assert "needs the directory" in str(exc)
    else:
        raise AssertionError("an image without its directory was sent")


def test_keep_newest_images_leaves_a_history_within_the_limit_untouched() -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///a.png"}}]}]
    assert keep_newest_images(messages, 1) is messages
    assert count_images(keep_newest_images(messages * 3, 2)) == 2
