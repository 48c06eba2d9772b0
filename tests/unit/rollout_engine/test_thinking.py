"""Thinking models through the episode loop: every environment sees only the answer after the reasoning, the
trajectory keeps the reply as sampled, a reply cut at the token limit is counted and never a success, and the
chat template's arguments reach the server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollout_engine.config import ModelConfig, OpenAIConfig, PolicyConfig
from rollout_engine.context import RunContext
from rollout_engine.envs import miniwob
from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.envs.judged import JudgedEnv
from rollout_engine.envs.miniwob import MiniWobEnv, MiniWobState
from rollout_engine.envs.reasoning_gym import ReasoningGymEnv
from rollout_engine.envs.textworld import GameSpec, TextWorldEnv, build_tasks
from rollout_engine.journal import Journal, read_journal
from rollout_engine.judge import Judge
from rollout_engine.live import progress_line
from rollout_engine.metrics import compute_metrics
from rollout_engine.policy import PolicyClient
from rollout_engine.progress import Progress
from rollout_engine.scheduler import Scheduler, SchedulerSettings
from rollout_engine.types import Completion, EpisodeSpec, Message, Task


class Replies:
    """A scripted policy: each reply a text or a Completion (for its finish_reason); it records what it was sent."""

    def __init__(self, replies: list[str | Completion]) -> None:
        self.replies = list(replies)
        self.sent: list[list[Message]] = []

    async def chat(self, messages: list[Message]) -> Completion:
        self.sent.append(list(messages))
        reply = self.replies.pop(0)
        if isinstance(reply, Completion):
            return reply
        return Completion(text=reply, finish_reason="stop", completion_tokens=3, completion_token_ids=[9, 8, 7])


def _context(tmp_path: Path, **kw: Any) -> RunContext:
    return RunContext(split="train", iteration=0, rank=0, seed=0, data_path=tmp_path, log_dir=tmp_path / "log", **kw)


def think(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


# --- TextWorld: the command parser takes the first line, which is <think> in a thinking reply ---------------

TEXTWORLD_TASK = Task.from_json(build_tasks(1, seed=11, quest_length=2)[0])


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the game of TEXTWORLD_TASK, generated once for this module (about 1.5 s)."""
    folder = tmp_path_factory.mktemp("games")
    env = TextWorldEnv(context=_context(folder), games_dir=str(folder))

    async def generate() -> None:
        try:
            await env.ensure_game(GameSpec.from_task(TEXTWORLD_TASK))
        finally:
            await env.close()

    asyncio.run(generate())
    return folder


async def test_textworld_plays_the_commands_after_the_reasoning(tmp_path: Path, games: Path) -> None:
    env = TextWorldEnv(context=_context(tmp_path), games_dir=str(games), max_steps=6)
    task = TEXTWORLD_TASK
    path = await env.ensure_game(GameSpec.from_task(task))
    first, second = json.loads((path.parent / "spec.json").read_text())["walkthrough"]
    replies = [
        think("I could look around.\nlook", first),  # the usual form
        f"The door is north.\ngo north\n</think>{second}",  # the template opened <think> in the prompt
    ]
    policy = Replies(replies)
    try:
        state, score = await env.run_episode(task, 0, policy, reasoning="think")
    finally:
        await env.close()
    assert score.success and score.info["won"]
    assert [turn.action["command"] for turn in state.turns] == [first.lower(), second.lower()]
    assert [turn.response for turn in state.turns] == replies, "the trajectory keeps the reply as sampled"
    assert [turn.env_reply for turn in state.turns] == [first, second]
    assert policy.sent[1][-2] == {"role": "assistant", "content": replies[0]}, "the history has the full reply"


async def test_textworld_reasoning_that_never_ends_is_an_invalid_action(tmp_path: Path, games: Path) -> None:
    env = TextWorldEnv(context=_context(tmp_path), games_dir=str(games), max_steps=2)
    task = TEXTWORLD_TASK
    cut = Completion(text="<think>\nlook\ngo east\nthe key is", finish_reason="length", completion_tokens=9)
    try:
        state, score = await env.run_episode(task, 0, Replies([cut, "look"]), reasoning="auto")
    finally:
        await env.close()
    assert state.turns[0].invalid_action and state.turns[0].action == {"command": None}
    assert state.turns[0].env_reply == "" and state.turns[0].truncated
    assert state.turns[1].action["command"] == "look" and state.turns[1].env_reply is None
    assert not score.success


async def test_reasoning_none_hands_the_whole_reply_to_the_environment(tmp_path: Path, games: Path) -> None:
    env = TextWorldEnv(context=_context(tmp_path), games_dir=str(games), max_steps=1)
    task = TEXTWORLD_TASK
    try:
        state, _ = await env.run_episode(task, 0, Replies([think("go east", "look")]), reasoning="none")
    finally:
        await env.close()
    assert state.turns[0].action["command"] == "<think>" and state.turns[0].env_reply is None


# --- MiniWoB++: the action parser takes the first action in the text, which the reasoning names first ----------


class FakeLocator:
    def __init__(self, page: FakePage, selector: str) -> None:
        self.page, self.ref = page, selector.removeprefix("aria-ref=")

    async def count(self) -> int:
        return int(self.ref in ("e3", "e5"))

    async def click(self, timeout: float) -> None:
        self.page.clicked.append(self.ref)

    async def aria_snapshot(self, mode: str) -> str:
        return '- button "TWO" [ref=e3]\n- button "ONE" [ref=e5]'


class FakePage:
    """The page of click-button: ONE is e5; clicking it wins, clicking anything else loses."""

    def __init__(self) -> None:
        self.clicked: list[str] = []

    async def evaluate(self, script: str, arg: Any = None) -> Any:
        if script == miniwob._READ_RESULT:
            return [(1.0 if self.clicked[-1] == "e5" else -1.0) if self.clicked else 0.0, bool(self.clicked)]
        return False  # _EXPOSE: no dialog open

    def locator(self, selector: str) -> FakeLocator:
        return FakeLocator(self, selector)


class PagelessMiniWob(MiniWobEnv):
    """The MiniWoB++ env with its page replaced (no browser): its parser and scoring are the real ones."""

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return MiniWobState(task=task, slot=slot, max_steps=2, page=FakePage(), goal="Click on the ONE button.")


async def test_miniwob_acts_on_the_answer_not_on_an_action_named_in_the_reasoning(tmp_path: Path) -> None:
    env = PagelessMiniWob(context=_context(tmp_path), chromium="/usr/bin/true", settle_ms=0)
    task = Task(task_id="mw", task_name="click-button", metadata={"miniwob_task": "click-button", "seed": 1})
    reply = think("click(e3) is TWO, not ONE. So not click(e3).", "click(e5)")
    state, score = await env.run_episode(task, 0, Replies([reply]), reasoning="think")
    assert state.page.clicked == ["e5"]
    assert state.turns[0].action == {"kind": "click", "ref": "e5", "error": None}
    assert score.success and score.reward == 1.0


# --- reasoning-gym: the answer rule takes the first number, which the reasoning holds -----------------------


def _chain_sum_task() -> Task:
    import reasoning_gym

    item = reasoning_gym.create_dataset("chain_sum", size=1, seed=3, min_terms=2, max_terms=2, min_digits=1)[0]
    item = json.loads(json.dumps(item))
    return Task(task_id="rg", task_name=item["question"], metadata={"dataset": "chain_sum", "entry": item})


async def test_reasoning_gym_scores_the_number_after_the_reasoning(tmp_path: Path) -> None:
    task = _chain_sum_task()
    answer = task.metadata["entry"]["answer"]
    env = ReasoningGymEnv(context=_context(tmp_path))
    reply = think(f"First guess: 1000. Then {answer} + 1? No.", answer)
    state, score = await env.run_episode(task, 0, Replies([reply]), reasoning="think")
    assert state.turns[0].action == {"answer": answer} and score.info["answer"] == answer
    assert score.success and score.reward == 1.0
    state, score = await env.run_episode(task, 0, Replies([reply]), reasoning="none")
    assert state.turns[0].action == {"answer": "1000"} and not score.success


# --- the LLM judge: the agent's answer and the judge's own verdict are read after the reasoning ---------------


class JudgeClient:
    """An OpenAI client that gives one verdict reply and records the requests."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])

    async def close(self) -> None:
        return None


async def test_judged_env_judges_the_answer_after_the_reasoning(tmp_path: Path) -> None:
    model = ModelConfig(reasoning="think", chat_template_kwargs={"enable_thinking": True})
    env = JudgedEnv(context=_context(tmp_path, model=model), max_turns=1)
    verdict = think("The answer says Paris.\nVerdict: FAILURE? No, it is right.", "Verdict: SUCCESS")
    env.judge.client = client = JudgeClient(verdict)
    task = Task(task_id="j", task_name="Capital of France?", definite_answer="Paris")
    reply = think("Lyon? ANSWER: Lyon. No: Paris.", "Paris")
    _, score = await env.run_episode(task, 0, Replies([reply]), reasoning="think")
    assert score.success and score.info["answer"] == "Paris" and score.judge_error is None
    sent = client.calls[0]["messages"][-1]["content"]
    assert "Agent answer: Paris" in sent and "Lyon" not in sent
    # the judge is the policy server (openai_config empty): the model's template arguments go with it
    assert client.calls[0]["extra_body"]["chat_template_kwargs"] == {"enable_thinking": True}


async def test_an_external_judge_gets_no_template_arguments_but_its_reasoning_is_split_off() -> None:
    judge_cfg = OpenAIConfig(base_url="https://judge.example.invalid/v1", model="r1")
    model = ModelConfig(reasoning="none", chat_template_kwargs={"enable_thinking": False})
    client = JudgeClient("<think>Verdict: SUCCESS, or is it?</think>\nVerdict: FAILURE")
    judge = Judge(judge_cfg, PolicyConfig(), client=client, model=model)
    assert (await judge.verdict([{"role": "user", "content": "?"}]))[0] is False
    assert client.calls[0]["extra_body"] is None


# --- the request carries the chat template's arguments ---------------------------------------------------


class RecordingOpenAI:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        choice = SimpleNamespace(message=SimpleNamespace(content="ok"), finish_reason="stop", token_ids=[1])
        return SimpleNamespace(choices=[choice], usage=None)

    async def close(self) -> None:
        return None


async def test_the_policy_request_carries_chat_template_kwargs_only_when_set() -> None:
    fake = RecordingOpenAI()
    kwargs = {"enable_thinking": False}
    policy = PolicyClient(PolicyConfig(top_k=20), 2, client=fake, chat_template_kwargs=kwargs)
    await policy.chat([{"role": "user", "content": "hi"}])
    assert fake.calls[0]["extra_body"] == {"return_token_ids": True, "top_k": 20, "chat_template_kwargs": kwargs}
    plain = PolicyClient(PolicyConfig(), 2, client=fake)
    assert "chat_template_kwargs" not in plain.request_args([])["extra_body"]
    bare = PolicyConfig(return_token_ids=False, return_logprobs=False)
    assert PolicyClient(bare, 2, client=fake).request_args([])["extra_body"] is None


# --- a reply cut at the token limit ---------------------------------------------------------------------------


class TwoStepEnv(Env):
    """Two turns, then success (reward 1) whatever was said: only the engine can make it a failure."""

    name = "two-step"

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=2)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        return [{"role": "user", "content": state.task.task_id}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        return StepResult(observation="next", done=len(state.turns) == 1, action={"seen": reply})

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=1.0, success=True, info={"steps": len(state.turns)})


def cut(text: str = "<think>\nstill thinking") -> Completion:
    return Completion(text=text, finish_reason="length", completion_tokens=256, completion_token_ids=[5] * 256)


class ByTask:
    """One scripted policy per task: the first message names the task."""

    def __init__(self, scripts: dict[str, Replies]) -> None:
        self.scripts = scripts

    async def chat(self, messages: list[Message]) -> Completion:
        return await self.scripts[messages[0]["content"]].chat(messages)


async def test_a_cut_final_reply_is_never_a_success_and_an_intermediate_one_is_only_counted(tmp_path: Path) -> None:
    policy = ByTask(
        {
            "final": Replies(["first", cut("done, I think the answ")]),
            "middle": Replies([cut(), "second"]),
            "clean": Replies(["first", "second"]),
        }
    )
    settings = SchedulerSettings(
        server_size=3, episode_timeout_s=5, infra_retries=0, infra_retry_budget=0, split="train", iteration=0,
        rank=0, policy_model="p", reasoning="think",
    )  # fmt: skip
    progress = Progress()
    journal = Journal(tmp_path / "rank_0.jsonl", resume=False)
    specs = [EpisodeSpec(Task(task_id=name, task_name=name), 0) for name in ("final", "middle", "clean")]
    progress.add([s.episode_id for s in specs])
    result = {t.task_id: t for t in await Scheduler(TwoStepEnv(), policy, journal, settings, progress).run(specs)}

    final = result["final"]
    assert not final.success and final.reward == 0.0 and final.status.value == "ok"
    assert "finish_reason length" in final.info["truncated"] and final.info["env_reward"] == 1.0
    assert final.turns[-1].env_reply is None and final.turns[-1].action == {"seen": "done, I think the answ"}
    middle = result["middle"]
    assert middle.success and middle.reward == 1.0 and "truncated" not in middle.info
    assert middle.turns[0].env_reply == "" and middle.turns[0].action == {"seen": ""}
    assert result["clean"].success

    metrics = compute_metrics(list(result.values()), wall_s=1.0, planned=3, cancelled=0)
    assert metrics["truncated_turns"] == 2 and metrics["truncated_turn_rate"] == round(2 / 6, 4)
    assert metrics["truncated_episodes"] == 1 and metrics["success_rate"] == round(2 / 3, 4)
    snap = progress.snapshot()
    assert snap["truncated_turns"] == 2 and snap["truncated_episodes"] == 1 and snap["successes"] == 2

    assert progress_line(snap).endswith(", failures: none, 2 replies cut, 0s")

    again = {t.task_id: t for t in read_journal(tmp_path / "rank_0.jsonl")}
    assert again["final"].turns[-1].response == "done, I think the answ"
    assert again["middle"].turns[0].env_reply == "" and again["middle"].turns[0].completion_token_ids == [5] * 256


def test_a_journal_line_written_before_env_reply_reads(tmp_path: Path) -> None:
    old_turn = {"index": 0, "messages": [], "response": "7", "finish_reason": "stop"}
    row = {
        "schema": "baton.trajectory/1", "episode_id": "t#0", "task_id": "t", "sample_index": 0, "split": "train",
        "iteration": 0, "rank": 0, "env": "e", "family": "", "difficulty": 1, "status": "ok", "turns": [old_turn],
    }  # fmt: skip
    (tmp_path / "rank_0.jsonl").write_text(json.dumps(row) + "\n")
    (turn,) = read_journal(tmp_path / "rank_0.jsonl")[0].turns
    assert turn.env_reply is None and turn.env_text == "7" and not turn.truncated


class JudgeFailsEnv(TwoStepEnv):
    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=0.0, success=False, judge_error="unparseable verdict after 4 tries")


async def test_a_judge_error_on_a_cut_last_reply_is_moot_and_kept_in_info() -> None:
    task = Task(task_id="j", task_name="j")
    _, score = await JudgeFailsEnv().run_episode(task, 0, Replies(["first", cut("ANSWER: Par")]))
    assert score.judge_error is None and not score.success and score.reward == 0.0
    assert score.info["judge_error"] == "unparseable verdict after 4 tries" and "truncated" in score.info
