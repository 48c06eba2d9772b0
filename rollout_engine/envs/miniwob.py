"""MiniWoB++ tasks in real headless Chromium (Playwright), one browser context per slot.

A task line names a MiniWoB++ page and a seed (docs/environments.md):
`{"task_id": "mw-click-test-0003", "env": "miniwob", "family": "click-test",
  "metadata": {"miniwob_task": "click-test", "seed": 3}}`.
The pages ship in the `miniwob` pip package, which is never imported (it pulls
in gymnasium): its files are found through `importlib.util.find_spec`.

Per episode: load the task page into the slot's page if it is not loaded,
`Math.seedrandom(seed)`, raise `core.EPISODE_MAX_TIME`, `core.startEpisodeReal()`,
wait for `WOB_TASK_READY`. The goal is `core.getUtterance()`; the observation is
the aria snapshot of `#wrap` (elements carry `[ref=eN]`), of `<body>` while a
dialog is open (jQuery UI puts it there), with MiniWoB++'s link-styled spans
given the link role. Actions are parsed by
`actions.parse_web_action`: `click(REF)`, `type(REF, "TEXT")`, `answer("TEXT")`
(ends the episode). A reply without an action, or one the page cannot perform
(no such element, not a text box), is an invalid action. The page's raw reward
(`WOB_RAW_REWARD_GLOBAL`, in [-1, 1]) is the reward and `WOB_DONE_GLOBAL` ends
the episode; success = raw reward > 0. With `screenshots: true`, the page the
model saw at step k is saved as images/<episode_id>/step_<kkk>.png under the
journal's directory and referenced (relative to it) from that turn.

`observation` says what the model is shown: `text` (the accessibility tree),
`screenshot` (the browser's viewport as a PNG, `viewport` pixels; actions at a
point: `click(X, Y)`, `type(X, Y, "TEXT")`) or `both` (the tree and the
screenshot; either kind of action). With a screenshot the page is captured when
the episode starts and after each action, saved as above and sent with the
observation (rollout_engine/images.py: by file:// URL, the newest few). `expert`
gives a scripted solver for the simple pages of `miniwob_experts` (demonstrations).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_engine.context import RunContext
from rollout_engine.envs.actions import WebAction, parse_web_action
from rollout_engine.envs.base import Env, EpisodeState, Expert, Score, StepResult
from rollout_engine.envs.browser import BrowserPool, find_chromium
from rollout_engine.envs.miniwob_experts import miniwob_expert
from rollout_engine.errors import ConfigError, EnvError
from rollout_engine.files import save_bytes
from rollout_engine.types import Message, Observation, Task

log = logging.getLogger(__name__)

TEXT_PROMPT = """You operate a web page to complete a task. The page is shown as an accessibility tree in which \
every element has a reference such as [ref=e4]. Reply with exactly one action and nothing else:
click(REF) to click an element, for example: click(e4)
type(REF, "TEXT") to type into a text box, for example: type(e5, "hello")
answer("TEXT") to finish when the task needs no more page actions."""
SCREENSHOT_PROMPT = """You operate a web page to complete a task. The page is shown as a screenshot of \
{width}x{height} pixels. Reply with exactly one action and nothing else:
click(X, Y) to click the point X pixels from the left and Y from the top, for example: click(80, 45)
type(X, Y, "TEXT") to click a text box at that point and type into it, for example: type(80, 120, "hello")
answer("TEXT") to finish when the task needs no more page actions."""
BOTH_PROMPT = """You operate a web page to complete a task. The page is shown as a screenshot of {width}x{height} \
pixels and as an accessibility tree in which every element has a reference such as [ref=e4]. Reply with exactly one \
action and nothing else:
click(REF) or click(X, Y) to click an element or a point of the screenshot, for example: click(e4) or click(80, 45)
type(REF, "TEXT") or type(X, Y, "TEXT") to type into a text box, for example: type(e5, "hello")
answer("TEXT") to finish when the task needs no more page actions."""
PROMPTS = {"text": TEXT_PROMPT, "screenshot": SCREENSHOT_PROMPT, "both": BOTH_PROMPT}
#: what an invalid action is told, per observation: the actions that observation takes
INVALID_FEEDBACK = {
    "text": 'Invalid action ({why}). Reply with one action: click(REF), type(REF, "TEXT") or answer("TEXT").',
    "screenshot": 'Invalid action ({why}). Reply with one action: click(X, Y), type(X, Y, "TEXT") or answer("TEXT").',
    "both": 'Invalid action ({why}). Reply with one action: click(REF) or click(X, Y), type(REF, "TEXT") or '
    'type(X, Y, "TEXT"), or answer("TEXT").',
}
# focus is blurred so that nothing of the slot's previous episode shows in the snapshot
_START_EPISODE = """([seed, ms]) => {
  if (document.activeElement) { document.activeElement.blur(); }
  Math.seedrandom(seed); core.EPISODE_MAX_TIME = ms; core.startEpisodeReal();
}"""
_READ_RESULT = "() => [WOB_RAW_REWARD_GLOBAL, WOB_DONE_GLOBAL]"
# Some pages draw links as styled spans (no role: the snapshot shows their words as plain text) and
# jQuery UI appends dialogs to <body>, outside #wrap. The spans get the link role; with a dialog open
# the snapshot is of <body>, less the reward display (last reward, episodes done) that lives there too.
_EXPOSE = """() => {
  document.querySelectorAll('span.alink:not([role])').forEach((e) => e.setAttribute('role', 'link'));
  const dialog = document.querySelector('body > .ui-dialog') !== null;
  const display = document.getElementById('reward-display');
  if (dialog && display) { display.style.display = 'none'; }
  return dialog;
}"""


def find_task_pages() -> Path:
    """Directory of the MiniWoB++ task pages inside the installed `miniwob` package (not imported)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or spec.origin is None:
        raise ConfigError("env=miniwob needs the miniwob package (pip install --no-deps miniwob) (got none installed)")
    return Path(spec.origin).parent / "html" / "miniwob"


def build_tasks(names: list[str], per_task: int, seed: int, difficulty: int = 1) -> list[dict[str, Any]]:
    """Task-file rows: `per_task` seeds per MiniWoB++ task name, drawn deterministically from `seed`."""
    rng = random.Random(seed)
    rows = []
    for name in names:
        for index, page_seed in enumerate(rng.sample(range(1_000_000), per_task)):
            rows.append(
                {
                    "task_id": f"mw-{name}-{index:04d}",
                    "task_name": f"MiniWoB++ {name} (seed {page_seed})",
                    "difficulty": difficulty,
                    "env": "miniwob",
                    "family": name,
                    "metadata": {"miniwob_task": name, "seed": page_seed},
                }
            )
    return rows


@dataclass
class MiniWobState(EpisodeState):
    """Episode state: the slot's page and what it last showed."""

    page: Any = None
    goal: str = ""
    snapshot: str = ""
    raw_reward: float = 0.0
    page_done: bool = False
    answer: str | None = None
    #: the screenshot of the page as it is now (observation screenshot or both), relative to the iteration dir
    shot: str = ""
    #: the page's first screenshot, taken at setup, saved once the episode has its id (initial_messages)
    first_png: bytes = b""


class MiniWobEnv(Env):
    """MiniWoB++ pages in one Chromium; `server_size` slots = browser contexts."""

    name = "miniwob"

    def __init__(
        self,
        context: RunContext,
        max_steps: int | None = None,
        stop_on_invalid: bool = False,
        episode_max_time_s: float = 600.0,
        screenshots: bool = False,
        chromium: str = "",
        action_timeout_s: float = 3.0,
        settle_ms: int = 50,
        headless: bool = True,
        observation: str = "text",
        viewport: tuple[int, int] | list[int] = (500, 300),
    ) -> None:
        problems = []
        if observation not in PROMPTS:
            problems.append(f"env.observation must be one of {', '.join(PROMPTS)} (got {observation!r})")
        size = list(viewport)
        if len(size) != 2 or not all(isinstance(v, int) and 100 <= v <= 4096 for v in size):
            problems.append(f"env.viewport must be [width, height] in pixels, each 100-4096 (got {size!r})")
        if max_steps is not None and max_steps < 1:
            problems.append(f"env.max_steps must be >= 1 or null for the split's difficulty budget (got {max_steps})")
        if episode_max_time_s <= 0 or action_timeout_s <= 0 or settle_ms < 0:
            problems.append(
                "env.episode_max_time_s and env.action_timeout_s must be > 0 seconds and env.settle_ms "
                f">= 0 (got {episode_max_time_s}, {action_timeout_s}, {settle_ms})"
            )
        executable = find_chromium(chromium)
        if executable is None:
            problems.append(
                f"env.chromium: no Chromium binary found (got {chromium!r}, BATON_CHROMIUM="
                f"{os.environ.get('BATON_CHROMIUM', '')!r}); apt-get install chromium or set BATON_CHROMIUM"
            )
        if problems:
            raise ConfigError(problems)
        self.context = context
        self.pages = find_task_pages()
        self.step_limit = max_steps
        self.stop_on_invalid = stop_on_invalid
        self.episode_max_time_ms = int(episode_max_time_s * 1000)
        self.observation = observation
        #: the model sees screenshots: they are taken after each action, for the next observation
        self.shows_screenshots = observation != "text"
        self.screenshots = screenshots
        self.viewport = (size[0], size[1])
        self.action_timeout_ms = action_timeout_s * 1000
        self.settle_ms = settle_ms
        self.pool = BrowserPool(str(executable), viewport=self.viewport, headless=headless)

    def check_task(self, task: Task) -> str | None:
        name, seed = task.metadata.get("miniwob_task"), task.metadata.get("seed")
        if not isinstance(name, str) or not (self.pages / f"{name}.html").is_file():
            return f"miniwob tasks need metadata.miniwob_task naming a page of {self.pages} (got {name!r})"
        if not isinstance(seed, int | str):
            return f"miniwob tasks need metadata.seed, an integer or string (got {seed!r})"
        return None

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        problem = self.check_task(task)
        if problem:
            raise EnvError(f"task {task.task_id!r}: {problem}")
        steps = self.step_limit or self.context.max_steps(task)
        try:
            page = await self._start_episode(task, slot)
            goal = await page.evaluate("() => core.getUtterance()")
            snapshot = await _snapshot(page)
            state = MiniWobState(task=task, slot=slot, max_steps=steps, page=page, goal=goal, snapshot=snapshot)
            if self.shows_screenshots:
                state.first_png = await page.screenshot(timeout=self.action_timeout_ms)
        except Exception as exc:
            await self.pool.discard(slot)
            raise EnvError(f"could not start MiniWoB++ {task.metadata['miniwob_task']}: {exc}") from exc
        return state

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        assert isinstance(state, MiniWobState)
        system = PROMPTS[self.observation].format(width=self.viewport[0], height=self.viewport[1])
        if state.first_png:  # a small write: the loop asks for the opening messages once per episode
            path = self.context.images_dir(state.episode_id) / "step_000.png"
            save_bytes(path, state.first_png)
            state.shot, state.first_png = path.relative_to(self.context.log_dir).as_posix(), b""
        goal = f"Task: {state.goal}"
        user = self._shown(state, f"{goal}\n\nPage:\n{state.snapshot}", goal)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _shown(self, state: MiniWobState, text: str, without_tree: str) -> str | Observation:
        """The observation: `text` (which holds the page's tree), or with observation screenshot `without_tree`,
        with the page's screenshot unless the observation is text only."""
        if self.observation == "text":
            return text
        return Observation(text if self.observation == "both" else without_tree, (state.shot,))

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        assert isinstance(state, MiniWobState)
        # the page the model saw, for people (with screenshot observations the turn has it already)
        images = await self._screenshot(state) if self.screenshots and not self.shows_screenshots else []
        action = parse_web_action(reply)
        error = "no click, type or answer action found" if action is None else await self._act(state, action)
        before = state.snapshot
        state.raw_reward, state.page_done = await state.page.evaluate(_READ_RESULT)
        state.snapshot = await _snapshot(state.page)
        if self.shows_screenshots:
            state.shot = (await self._screenshot(state, len(state.turns) + 1))[0]
        invalid = error is not None
        feedback = INVALID_FEEDBACK[self.observation].format(why=error) if invalid else ""
        text = f"{feedback}\n\n{state.snapshot}" if invalid else state.snapshot
        observation = self._shown(state, text, feedback or "The page after your action.")
        answered = action is not None and action.kind == "answer"
        return StepResult(
            observation=observation,
            reward=float(state.raw_reward) if state.page_done else 0.0,
            done=bool(state.page_done) or answered,
            invalid_action=invalid,
            action=None if action is None else {**action.to_json(), "error": error},
            state_changed=state.snapshot != before or bool(state.page_done),
            images=images,
        )

    async def score(self, state: EpisodeState) -> Score:
        assert isinstance(state, MiniWobState)
        reward = float(state.raw_reward) if state.page_done else 0.0
        info = {"goal": state.goal, "page_done": bool(state.page_done), "raw_reward": reward, "answer": state.answer}
        return Score(reward=reward, success=reward > 0, info=info)

    async def teardown_state(self, state: EpisodeState) -> None:
        if not state.done:  # failed or cancelled mid-episode: the next episode gets a fresh context
            await self.pool.discard(state.slot)

    async def expert(self, task: Task) -> Expert | None:
        """The scripted solver of the task's page (miniwob_experts.SOLVERS), or None."""
        return miniwob_expert(str(task.metadata.get("miniwob_task")))

    async def _start_episode(self, task: Task, slot: int) -> Any:
        browser_slot = await self.pool.slot(slot)
        url = (self.pages / f"{task.metadata['miniwob_task']}.html").as_uri()
        if browser_slot.url != url:
            browser_slot.url = ""  # an interrupted navigation must not count as loaded
            await browser_slot.page.goto(url)
            browser_slot.url = url
        page = browser_slot.page
        await page.evaluate(_START_EPISODE, [str(task.metadata["seed"]), self.episode_max_time_ms])
        await page.wait_for_function("() => WOB_TASK_READY === true", timeout=self.action_timeout_ms * 10)
        return page

    async def _act(self, state: MiniWobState, action: WebAction) -> str | None:
        """Perform `action`; the reason it could not be done, or None."""
        if action.kind == "answer":
            state.answer = action.text
            return None
        if action.point is not None:
            return await self._act_at(state, action)
        if self.observation == "screenshot":  # the model was never shown the elements' references
            return f"the page is shown only as a screenshot here: act on a point of it, not on {action.ref}"
        locator = state.page.locator(f"aria-ref={action.ref}")
        try:
            if await locator.count() == 0:
                return f"no element {action.ref} on the page"
            if action.kind == "click":
                await locator.click(timeout=self.action_timeout_ms)
            else:
                await locator.fill(action.text or "", timeout=self.action_timeout_ms)
        except Exception as exc:  # Playwright raises for a missing, hidden or wrong-kind element
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"cannot {action.kind} {action.ref}: {first_line[:160]}"
        if self.settle_ms:
            await state.page.wait_for_timeout(self.settle_ms)  # lets page handlers that use timers run
        return None

    async def _act_at(self, state: MiniWobState, action: WebAction) -> str | None:
        """Click (and for type, then type) at a point of the screenshot; why it could not be done, or None."""
        assert action.point is not None
        x, y = action.point
        if not (0 <= x < self.viewport[0] and 0 <= y < self.viewport[1]):
            return f"({x}, {y}) is outside the {self.viewport[0]}x{self.viewport[1]} screenshot"
        if self.observation == "text":
            return "the page is not shown as a screenshot here: act on elements by their [ref=...]"
        await state.page.mouse.click(x, y)
        if action.kind == "type":
            await state.page.keyboard.press("Control+A")
            await state.page.keyboard.type(action.text or "")
        if self.settle_ms:
            await state.page.wait_for_timeout(self.settle_ms)
        return None

    async def _screenshot(self, state: MiniWobState, step: int | None = None) -> list[str]:
        """The browser's viewport as images/<episode_id>/step_<step>.png (default: this turn's); its relative path."""
        step = len(state.turns) if step is None else step
        path = self.context.images_dir(state.episode_id) / f"step_{step:03d}.png"
        png = await state.page.screenshot(timeout=self.action_timeout_ms)
        await asyncio.to_thread(save_bytes, path, png)
        return [path.relative_to(self.context.log_dir).as_posix()]


async def _snapshot(page: Any) -> str:
    """The aria snapshot of what the task shows: `#wrap`, or `<body>` while a dialog is open (`_EXPOSE`)."""
    dialog = await page.evaluate(_EXPOSE)
    return str(await page.locator("body" if dialog else "#wrap").aria_snapshot(mode="ai"))
