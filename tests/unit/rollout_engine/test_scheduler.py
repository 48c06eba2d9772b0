"""Scheduler logic around the environment: failure kinds, infra retries, deadlines, slots, cancellation.

Uses a tiny fake environment and a scripted policy (the real ones are covered by e2e tests).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pytest

from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.errors import EnvError, JudgeError, ModelError, PolicyDown
from rollout_engine.journal import Journal, read_journal
from rollout_engine.progress import Progress
from rollout_engine.scheduler import Scheduler, SchedulerSettings
from rollout_engine.types import Completion, EpisodeSpec, Failure, Task


class EchoPolicy:
    async def chat(self, messages):
        await asyncio.sleep(0)
        return Completion(text="ok", completion_tokens=1)


class FakeEnv(Env):
    """Behaviour per task id: 'ok', 'flaky' (first attempt fails), 'broken', 'slow', 'judge', 'model'."""

    name = "fake"

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.live = 0
        self.max_live = 0
        self.torn_down = 0

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        self.attempts[task.task_id] = self.attempts.get(task.task_id, 0) + 1
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        if task.task_id.startswith("flaky") and self.attempts[task.task_id] == 1:
            self.live -= 1
            raise EnvError("browser crashed")
        return EpisodeState(task=task, slot=slot, max_steps=3)

    def initial_messages(self, state):
        return [{"role": "user", "content": state.task.task_name}]

    async def env_response(self, state, reply):
        kind = state.task.task_id.split("-")[0]
        if kind == "broken":
            raise RuntimeError("game over")
        if kind == "model":
            raise ModelError("server gone")
        if kind == "down":
            raise PolicyDown("the policy server at http://x/v1 stopped answering")
        if kind == "slow" and state.turns:
            await asyncio.sleep(60)
        await asyncio.sleep(0.01)
        return StepResult(observation="next", done=kind != "slow" or len(state.turns) > 5)

    async def score(self, state):
        if state.task.task_id.startswith("judge"):
            raise JudgeError("no verdict")
        return Score(reward=1.0, success=True)

    async def teardown_state(self, state):
        self.live -= 1
        self.torn_down += 1


def settings(**kw) -> SchedulerSettings:
    base = dict(
        server_size=2,
        episode_timeout_s=0.5,
        infra_retries=1,
        infra_retry_budget=10,
        split="train",
        iteration=0,
        rank=0,
        policy_model="p",
    )
    return SchedulerSettings(**{**base, **kw})


def specs(*ids: str) -> list[EpisodeSpec]:
    return [EpisodeSpec(Task(task_id=i, task_name=i), 0) for i in ids]


async def run(tmp_path: Path, ids: tuple[str, ...], **kw):
    env = FakeEnv()
    journal = Journal(tmp_path / "rank_0.jsonl", resume=False)
    sched = Scheduler(env, EchoPolicy(), journal, settings(**kw), Progress())
    result = {t.task_id: t for t in await sched.run(specs(*ids))}
    return env, result


async def test_failure_kinds_and_retries(tmp_path: Path) -> None:
    env, result = await run(tmp_path, ("ok-1", "flaky-1", "broken-1", "slow-1", "judge-1", "model-1"))
    assert result["ok-1"].status is Failure.OK and result["ok-1"].success
    assert result["flaky-1"].status is Failure.OK and result["flaky-1"].attempts == 2
    assert result["broken-1"].status is Failure.ENV_ERROR and "game over" in result["broken-1"].error
    assert result["broken-1"].attempts == 2 and env.attempts["broken-1"] == 2
    assert result["slow-1"].status is Failure.TIMEOUT and len(result["slow-1"].turns) == 1  # turns kept
    assert result["judge-1"].status is Failure.JUDGE_ERROR and result["judge-1"].attempts == 1  # not re-run
    assert result["model-1"].status is Failure.MODEL_ERROR
    assert not any(t.success for t in result.values() if t.status is not Failure.OK)
    assert env.live == 0  # every episode torn down, timeouts included
    assert {t.episode_id for t in read_journal(tmp_path / "rank_0.jsonl")} == {f"{i}#0" for i in result}


async def test_a_dead_policy_server_stops_the_rollout_and_fails_no_episode(tmp_path: Path) -> None:
    """PolicyDown is infrastructure: it leaves run() (no retry, no model_error row); what finished is journaled."""
    env = FakeEnv()
    journal = Journal(tmp_path / "rank_0.jsonl", resume=False)
    sched = Scheduler(env, EchoPolicy(), journal, settings(episode_timeout_s=100), Progress())
    with pytest.raises(PolicyDown):
        await sched.run(specs("ok-1", "ok-2", "down-1", "slow-1"))
    journaled = read_journal(tmp_path / "rank_0.jsonl")
    assert {t.episode_id for t in journaled} == {t.episode_id for t in sched.finished} <= {"ok-1#0", "ok-2#0"}
    assert env.attempts["down-1"] == 1 and env.live == 0  # not re-run; every episode torn down


async def test_retry_budget_is_shared(tmp_path: Path) -> None:
    env, result = await run(tmp_path, ("broken-1", "broken-2", "broken-3"), infra_retries=5, infra_retry_budget=2)
    assert sum(env.attempts.values()) == 3 + 2
    assert all(t.status is Failure.ENV_ERROR for t in result.values())


async def test_server_size_limits_live_episodes(tmp_path: Path) -> None:
    env, result = await run(tmp_path, tuple(f"ok-{i}" for i in range(12)), server_size=3)
    assert env.max_live == 3 and len(result) == 12


async def test_cancel_journals_only_finished_and_tears_down(tmp_path: Path) -> None:
    env = FakeEnv()
    journal = Journal(tmp_path / "rank_0.jsonl", resume=False)
    sched = Scheduler(env, EchoPolicy(), journal, settings(episode_timeout_s=100), Progress())
    work = asyncio.create_task(sched.run(specs("ok-1", "slow-1", "slow-2", "ok-2")))
    while len(sched.finished) < 1:
        await asyncio.sleep(0.01)
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    journaled = read_journal(tmp_path / "rank_0.jsonl")
    assert {t.episode_id for t in journaled} == {t.episode_id for t in sched.finished}
    assert all(t.status is not Failure.CANCELLED for t in journaled)
    assert env.live == 0


async def test_cancel_during_a_journal_write_waits_for_it_before_the_seal(tmp_path: Path) -> None:
    """A cancellation while a line is being written: the seal reads the file after the write (issue 11, item 6)."""
    started, release = threading.Event(), threading.Event()

    class SlowJournal(Journal):
        def append(self, trajectory) -> None:
            started.set()
            release.wait(5)  # the write is under way in its thread when the rollout is cancelled
            super().append(trajectory)

    journal = SlowJournal(tmp_path / "rank_0.jsonl", resume=False)
    sched = Scheduler(FakeEnv(), EchoPolicy(), journal, settings(), Progress())
    work = asyncio.create_task(sched.run(specs("ok-1")))
    while not started.is_set():
        await asyncio.sleep(0.01)
    work.cancel()
    threading.Timer(0.2, release.set).start()
    await asyncio.gather(work, return_exceptions=True)
    manifest = journal.seal(planned=1)
    release.wait(5)
    await asyncio.sleep(0.2)  # a write the cancellation left behind lands now, after the seal
    data = (tmp_path / "rank_0.jsonl").read_bytes()
    assert manifest["episodes"] == len(read_journal(tmp_path / "rank_0.jsonl")) == 1
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest() and manifest["bytes"] == len(data)
    assert [t.episode_id for t in sched.finished] == ["ok-1#0"]  # metrics count what the file holds
