"""One rollout from a validated config: check everything, then write and run.

`run_rollout(cfg, resolved_yaml)` returns the process exit code:

1. `prepare`: load the task file, build the environment, check every task
   against it, sample and split for this rank, probe the policy server. Any
   problem is a `ConfigError` (exit 2) and nothing has been written yet.
2. Save the resolved config as `rank_<r>.config.yaml` beside the journal, open
   the journal (resume skips what it holds; otherwise an old one is moved
   aside), start the environment and the live view, schedule the episodes.
3. On SIGINT / SIGTERM: stop launching, cancel in-flight episodes (their
   `teardown_state` runs; a journal write under way finishes first),
   close the environment, seal what finished once the scheduler has
   returned (no write in flight: `Journal.seal` checks), exit
   130 / 143. When the policy server stops answering (`PolicyDown`): the
   same, exit 75 (EX_TEMPFAIL): run.sh restarts vLLM and resumes the rest.
   Always: seal the journal, append metrics, print the summary.

With `takeover_plan=<takeover.json>` (--on-rank-failure continue:
rollout_engine.takeover), the rank rolls out, instead of its own share, the
episodes of each dead rank that the plan assigns to it: it plans the dead
rank's share as that rank did (same seed, same sampling), keeps the assigned
ids and journals them to `rank_<r>.takeover_<d>.jsonl`, one journal and one
sealed manifest per dead rank, resumable like its own journal. Its config is
saved as `rank_<r>.takeover.config.yaml`, and its metrics record carries
`takeover_of` (the dead ranks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rollout_engine.build import build_env
from rollout_engine.config import PolicyConfig, RolloutConfig
from rollout_engine.envs.base import Env
from rollout_engine.errors import ConfigError, InfraError
from rollout_engine.exits import Exit
from rollout_engine.files import save_text
from rollout_engine.images import MediaSettings, images_per_prompt
from rollout_engine.journal import Journal, JournalRouter
from rollout_engine.layout import Layout, journal_name, rollout_config_name, takeover_journal_name
from rollout_engine.live import build_view, run_live
from rollout_engine.metrics import compute_metrics, print_summary, save_metrics
from rollout_engine.policy import PolicyClient
from rollout_engine.progress import Progress
from rollout_engine.scheduler import Scheduler, SchedulerSettings
from rollout_engine.takeover import assigned_specs, load_takeover_plan, takeover_plan_file
from rollout_engine.tasks import load_tasks, plan_rank, rank_limits, tasks_path
from rollout_engine.types import EpisodeSpec, Task

logger = logging.getLogger(__name__)

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
#: the policy server stopped answering (sysexits' EX_TEMPFAIL): restart it and resume


@dataclass(frozen=True)
class Work:
    """The episodes of one journal: this rank's own share, or those of dead rank `takeover_of` it took over."""

    journal: str
    specs: list[EpisodeSpec]
    takeover_of: int | None = None


@dataclass
class Prepared:
    """Everything checked and built before the first write."""

    env: Env
    policy: PolicyClient
    work: list[Work]
    settings: SchedulerSettings

    @property
    def specs(self) -> list[EpisodeSpec]:
        return [spec for work in self.work for spec in work.specs]


def plan_work(cfg: RolloutConfig, tasks: list[Task]) -> list[Work]:
    """This rank's own share; with `takeover_plan`, the dead ranks' episodes the plan assigns to this rank."""
    if not cfg.takeover_plan:
        return [Work(journal_name(cfg.rank), plan_rank(tasks, cfg, cfg.rank))]
    path = takeover_plan_file(cfg)
    plan = load_takeover_plan(path, "takeover_plan")
    shares = {d: plan_rank(tasks, cfg, d) for d in plan.dead if 0 <= d < len(cfg.rank_weights)}
    assigned = assigned_specs(plan, cfg, shares, f"takeover_plan={str(path)!r}")
    return [Work(takeover_journal_name(cfg.rank, dead), specs, dead) for dead, specs in assigned.items()]


def check_tasks(env: Env, tasks: list, path: Path) -> None:
    problems = [f"task file {path}: task {t.task_id!r}: {msg}" for t in tasks if (msg := env.check_task(t))]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ConfigError([*problems[:5], f"fix these tasks or choose the environment they were written for{more}"])


async def prepare(cfg: RolloutConfig) -> Prepared:
    """All checks of the input, in order, with no writes."""
    path = tasks_path(cfg)
    tasks = load_tasks(path, f"env_config.{cfg.split}_tasks")
    env = build_env(cfg)
    check_tasks(env, tasks, path)
    work = plan_work(cfg, tasks)
    sessions, slots = rank_limits(cfg)
    policy = PolicyClient(sampling_config(cfg), sessions, chat_template_kwargs=cfg.model_config.chat_template_kwargs)
    try:
        await policy.check_server()
    except ConfigError:
        await policy.close()
        raise
    settings = SchedulerSettings(
        server_size=slots,
        episode_timeout_s=cfg.env_config.episode_timeout_s,
        infra_retries=cfg.env_config.infra_retries,
        infra_retry_budget=cfg.env_config.infra_retry_budget,
        split=cfg.split,
        iteration=cfg.iteration,
        rank=cfg.rank,
        policy_model=cfg.policy_config.model,
        policy_version=cfg.policy_version,
        reasoning=cfg.model_config.reasoning,
        media=MediaSettings(
            Layout(cfg.log_path).iteration_dir(cfg.split, cfg.iteration),
            images_per_prompt(cfg.vllm_config.limit_mm_per_prompt),
        ),
    )
    return Prepared(env, policy, work, settings)


def sampling_config(cfg: RolloutConfig) -> PolicyConfig:
    """The policy settings of this rollout: greedy (temperature 0) on test with env_config.test_greedy."""
    if cfg.split == "test" and cfg.env_config.test_greedy:
        return dataclasses.replace(cfg.policy_config, temperature=0.0)
    return cfg.policy_config


def status_path(cfg: RolloutConfig) -> Path:
    return Layout(cfg.log_path).status(None if len(cfg.rank_weights) == 1 else cfg.rank)


def metrics_path(cfg: RolloutConfig) -> Path:
    """metrics.jsonl on one node; on several, a file of this rank's own (the master merges them:
    appends from several NFS clients to one file are not atomic)."""
    layout = Layout(cfg.log_path)
    return layout.metrics if len(cfg.rank_weights) == 1 else layout.rank_metrics(cfg.rank)


def config_name(cfg: RolloutConfig) -> str:
    """The resolved config's file beside the journal (a takeover's is apart from the rank's own rollout's)."""
    return rollout_config_name(cfg.rank, takeover=bool(cfg.takeover_plan))


async def run_rollout(cfg: RolloutConfig, resolved_yaml: str) -> int:
    """The whole rollout; returns the exit code (0, or 130/143 after a signal)."""
    prepared = await prepare(cfg)
    started = time.time()
    out_dir = Layout(cfg.log_path).iteration_dir(cfg.split, cfg.iteration)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_text(out_dir / config_name(cfg), resolved_yaml)
    journals = [Journal(out_dir / work.journal, cfg.resume) for work in prepared.work]
    done = {episode_id for journal in journals for episode_id in journal.done_ids}
    todo = [s for s in prepared.specs if s.episode_id not in done]
    progress = Progress(
        skipped=len(prepared.specs) - len(todo), split=cfg.split, iteration=cfg.iteration, rank=cfg.rank
    )
    progress.add([s.episode_id for s in todo])
    takeover_of = [work.takeover_of for work in prepared.work if work.takeover_of is not None]
    logger.info(
        "rollout %s iter %d rank %d: %d episodes (%d already journaled), %d slots%s",
        cfg.split,
        cfg.iteration,
        cfg.rank,
        len(todo),
        progress.skipped,
        prepared.settings.server_size,
        f", taking over from ranks {takeover_of}" if takeover_of else "",
    )
    live = asyncio.create_task(
        run_live(progress, build_view(cfg.env_config.live_view), status_path(cfg), cfg.env_config.status_interval_s)
    )
    router = JournalRouter({s.episode_id: j for j, w in zip(journals, prepared.work, strict=True) for s in w.specs})
    scheduler = Scheduler(prepared.env, prepared.policy, router, prepared.settings, progress)
    down: InfraError | None = None
    try:
        received = await _run_until_signal(prepared, scheduler, todo)
    except InfraError as exc:
        received, down = None, exc
        progress.policy_down = str(exc)  # the last status.json says so (run.sh's view, the dashboard)
    live.cancel()
    await asyncio.gather(live, return_exceptions=True)
    planned_ids = {s.episode_id for s in prepared.specs}
    all_done = [t for journal in journals for t in journal.done if t.episode_id in planned_ids]
    all_done += scheduler.finished
    manifests = [j.seal(planned=len(w.specs)) for j, w in zip(journals, prepared.work, strict=True)]
    journaled = sum(m["episodes"] for m in manifests)
    metrics = compute_metrics(
        all_done, time.time() - started, len(prepared.specs), cancelled=len(todo) - len(scheduler.finished)
    )
    metrics.update(
        split=cfg.split,
        iteration=cfg.iteration,
        rank=cfg.rank,
        policy_model=cfg.policy_config.model,
        policy_version=cfg.policy_version,
        complete=all(m["complete"] for m in manifests),
        interrupted=received.name if received else ("policy server down" if down else None),
    )
    if takeover_of:
        metrics["takeover_of"] = takeover_of
    save_metrics(metrics_path(cfg), metrics, shared=len(cfg.rank_weights) == 1)
    print_summary(metrics)
    if received:
        logger.warning(
            "stopped by %s: %d of %d episodes journaled; rerun with resume=true to finish",
            received.name,
            journaled,
            len(prepared.specs),
        )
        return SIGNAL_EXIT[received]
    if down:
        logger.error(
            "%s: %d of %d episodes journaled; the rest run again once the server is back (resume=true)",
            down,
            journaled,
            len(prepared.specs),
        )
        return Exit.POLICY_DOWN
    return 0


async def _run_until_signal(prepared: Prepared, scheduler: Scheduler, todo: list[EpisodeSpec]) -> signal.Signals | None:
    """Run the scheduler with SIGINT/SIGTERM cancelling it; returns the signal received, if any."""
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    work = asyncio.create_task(_run_env(prepared, scheduler, todo))

    def on_signal(sig: signal.Signals) -> None:
        if not received:
            logger.warning("%s received: cancelling in-flight episodes", sig.name)
            received.append(sig)
            work.cancel()

    for sig in SIGNAL_EXIT:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await work
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for sig in SIGNAL_EXIT:
            loop.remove_signal_handler(sig)
    return received[0] if received else None


async def _run_env(prepared: Prepared, scheduler: Scheduler, todo: list[EpisodeSpec]) -> None:
    try:
        await prepared.env.start()
        await scheduler.run(todo)
    finally:
        await prepared.env.close()
        await prepared.policy.close()
