"""The asynchronous scheduler: every episode its own asyncio task.

An episode waits for an environment slot (`server_size` slots, handed out by a
queue of slot numbers so environments know which one they hold), then plays
under `asyncio.wait_for(episode_timeout_s)`. Model requests are limited
separately by the policy client's semaphore (`max_vllm_sessions`), so an
episode that is in the environment never holds a model slot and no episode
ever waits for another's step. Tasks are created in plan order and slots are
granted first come first served, so hardest-first ordering holds.

Failures are recorded on the trajectory (`Failure`): env_error, model_error,
context_overflow, timeout, judge_error. env_error, model_error and timeout are
re-run up to `infra_retries` times per episode within a rollout-wide
`infra_retry_budget`. An `InfraError` (the policy server is down: `PolicyDown`)
is no episode's failure: it cancels every episode and leaves `run()`, so that
nothing it touched is journaled. Turns played before a failure are kept. Finished
trajectories are journaled as they complete; cancelled episodes are not, and a
cancellation during a journal write lets the write finish and counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from rollout_engine.envs.base import ChatPolicy, Env, EpisodeState, Score
from rollout_engine.errors import ContextOverflowError, InfraError, JudgeError, ModelError
from rollout_engine.images import MediaSettings
from rollout_engine.journal import Journal, JournalRouter
from rollout_engine.progress import Progress
from rollout_engine.types import EpisodeSpec, Failure, Trajectory

logger = logging.getLogger(__name__)

RETRIED = frozenset({Failure.ENV_ERROR, Failure.MODEL_ERROR, Failure.TIMEOUT})


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler needs from the config (this rank's limits: rollout_engine.tasks.rank_limits)."""

    server_size: int
    episode_timeout_s: float
    infra_retries: int
    infra_retry_budget: int
    split: str
    iteration: int
    rank: int
    policy_model: str
    policy_version: int | None = None
    #: model_config.reasoning: how each reply is split before the environment sees it (rollout_engine.reasoning)
    reasoning: str = "auto"
    #: where observations' images are and how many a prompt keeps (rollout_engine.images)
    media: MediaSettings = field(default_factory=MediaSettings)


class Scheduler:
    """Runs a list of episodes concurrently and journals each as it finishes."""

    def __init__(
        self,
        env: Env,
        policy: ChatPolicy,
        journal: Journal | JournalRouter,
        settings: SchedulerSettings,
        progress: Progress,
    ) -> None:
        self.env = env
        self.policy = policy
        self.journal = journal
        self.settings = settings
        self.progress = progress
        self.retry_budget = settings.infra_retry_budget
        self.slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(settings.server_size):
            self.slots.put_nowait(slot)
        self.finished: list[Trajectory] = []

    async def run(self, specs: list[EpisodeSpec]) -> list[Trajectory]:
        """Play every episode; on cancellation cancel them all, wait for their cleanup, re-raise."""
        tasks = [asyncio.create_task(self.run_episode(spec), name=spec.episode_id) for spec in specs]
        try:
            for next_done in asyncio.as_completed(tasks):
                trajectory = await next_done
                try:
                    await self.journal.write(trajectory)
                except asyncio.CancelledError:
                    self.record(trajectory)  # Journal.write finished the write first: the line is in the file
                    raise
                self.record(trajectory)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.finished

    def record(self, trajectory: Trajectory) -> None:
        """Count a journaled trajectory as finished."""
        self.finished.append(trajectory)
        self.progress.finish(trajectory)

    async def run_episode(self, spec: EpisodeSpec) -> Trajectory:
        """One episode with its infrastructure retries."""
        attempt = 1
        while True:
            slot = await self.slots.get()
            try:
                trajectory = await self.attempt(spec, slot, attempt)
            finally:
                self.slots.put_nowait(slot)
            if trajectory.status not in RETRIED or attempt > self.settings.infra_retries or self.retry_budget <= 0:
                return trajectory
            self.retry_budget -= 1
            logger.info("%s: %s (%s), running it again", spec.episode_id, trajectory.status.value, trajectory.error)
            attempt += 1

    async def attempt(self, spec: EpisodeSpec, slot: int, attempt: int) -> Trajectory:
        """Play one attempt under the episode deadline and turn its outcome into a trajectory."""
        states: list[EpisodeState] = []
        started = time.time()
        self.progress.start(spec.episode_id)

        def keep(state: EpisodeState) -> None:
            states.append(state)
            self.progress.attach(spec.episode_id, state)

        score: Score | None = None
        status, error = Failure.OK, None
        try:
            episode = self.env.run_episode(
                spec.task,
                slot,
                self.policy,
                on_state=keep,
                episode_id=spec.episode_id,
                reasoning=self.settings.reasoning,
                media_root=self.settings.media.root,
                images_per_prompt=self.settings.media.per_prompt,
            )
            _, score = await asyncio.wait_for(episode, self.settings.episode_timeout_s)
            if score.judge_error:
                status, error = Failure.JUDGE_ERROR, score.judge_error
        except TimeoutError:
            limit = self.settings.episode_timeout_s
            status, error = Failure.TIMEOUT, f"episode exceeded env_config.episode_timeout_s={limit}"
        except InfraError:
            raise
        except ContextOverflowError as exc:
            status, error = Failure.CONTEXT_OVERFLOW, str(exc)
        except ModelError as exc:
            status, error = Failure.MODEL_ERROR, str(exc)
        except JudgeError as exc:
            status, error = Failure.JUDGE_ERROR, str(exc)
        except Exception as exc:  # anything else the environment raised is its failure, not the batch's
            logger.debug("%s: environment error", spec.episode_id, exc_info=True)
            status, error = Failure.ENV_ERROR, f"{type(exc).__name__}: {exc}"
        return self.trajectory(spec, states[0] if states else None, score, status, error, attempt, started)

    def trajectory(
        self,
        spec: EpisodeSpec,
        state: EpisodeState | None,
        score: Score | None,
        status: Failure,
        error: str | None,
        attempt: int,
        started: float,
    ) -> Trajectory:
        ok = status is Failure.OK and score is not None
        info = dict(score.info) if score is not None else {}
        if state is not None:
            info["invalid_actions"] = state.invalid_actions
        return Trajectory(
            episode_id=spec.episode_id,
            task_id=spec.task.task_id,
            sample_index=spec.sample_index,
            split=self.settings.split,
            iteration=self.settings.iteration,
            rank=self.settings.rank,
            env=self.env.name,
            family=spec.task.family or str(spec.task.metadata.get("dataset") or spec.task.metadata.get("domain") or ""),
            difficulty=spec.task.difficulty,
            status=status,
            error=error,
            reward=score.reward if ok else 0.0,
            success=bool(ok and score.success),
            turns=list(state.turns) if state is not None else [],
            policy_model=self.settings.policy_model,
            policy_version=self.settings.policy_version,
            attempts=attempt,
            started_at=started,
            finished_at=time.time(),
            info=info,
        )
