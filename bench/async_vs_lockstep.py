"""Benchmark 1: the asynchronous engine against a lockstep baseline, side by side.

    PYTHONPATH=. $BATON_APP_PY -m bench.async_vs_lockstep            # full run, starts its own vLLM
    PYTHONPATH=. $BATON_APP_PY -m bench.async_vs_lockstep --quick    # small sanity run
    PYTHONPATH=. $BATON_APP_PY -m bench.async_vs_lockstep --base-url http://127.0.0.1:8100/v1

Both sides play the same seeded multi-turn workload (`bench.workload`:
heavy-tailed environment latency, heavy-tailed exact reply lengths) against
the same vLLM through the engine's policy client with the same request limit.
The async side is the engine's own `Scheduler` (episodes as asyncio tasks,
environment slots, journal); the lockstep side (`bench.lockstep`) makes turn k
of every episode in a batch wait for turn k of all of them. The last line
printed is the wall-time ratio lockstep / async.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.lockstep import run_lockstep
from bench.server import add_server_args, bench_logging, serve
from bench.workload import BudgetedPolicy, LatencyEnv, Workload, make_tasks
from rollout_engine.config import PolicyConfig
from rollout_engine.journal import Journal
from rollout_engine.progress import Progress
from rollout_engine.scheduler import Scheduler, SchedulerSettings
from rollout_engine.types import EpisodeSpec, Failure

logger = logging.getLogger("bench.async_vs_lockstep")


@dataclass
class Side:
    """The measured outcome of one scheduler on the workload."""

    name: str
    wall_s: float
    episodes: int
    completion_tokens: int
    failed: int = 0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.async_vs_lockstep", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--quick", action="store_true", help="small sanity run (16 episodes, 8 slots, <= 4 turns)")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per side (default 64)")
    parser.add_argument("--slots", type=int, default=32, help="environment slots, env_config.server_size (32)")
    parser.add_argument("--sessions", type=int, default=32, help="model requests in flight, max_vllm_sessions (32)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.slots, args.sessions = 16, 8, 8
    for name in ("episodes", "slots", "sessions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1 (got {getattr(args, name)})")
    return args


def workload_for(args: argparse.Namespace) -> Workload:
    return Workload(seed=args.seed, max_turns=4) if args.quick else Workload(seed=args.seed)


async def report_progress(name: str, progress: Progress, total: int) -> None:
    started = time.monotonic()
    while True:
        await asyncio.sleep(5)
        snap = progress.snapshot()
        print(
            f"  {name}: {snap['finished']}/{total} episodes, {time.monotonic() - started:.0f} s, "
            f"{snap['completion_tokens']} tokens",
            file=sys.stderr,
            flush=True,
        )


async def run_async(args: argparse.Namespace, base_url: str, workload: Workload, log_dir: Path) -> Side:
    """The engine's scheduler and episode loop, journal included."""
    env = LatencyEnv(workload)
    policy = BudgetedPolicy(PolicyConfig(base_url=base_url, model=args.model), args.sessions)
    specs = [EpisodeSpec(task, 0) for task in make_tasks(args.episodes)]
    settings = SchedulerSettings(
        server_size=args.slots,
        episode_timeout_s=600.0,
        infra_retries=0,
        infra_retry_budget=0,
        split="test",
        iteration=0,
        rank=0,
        policy_model=args.model,
    )
    progress = Progress()
    progress.add([s.episode_id for s in specs])
    scheduler = Scheduler(env, policy, Journal(log_dir / "rank_0.jsonl", resume=False), settings, progress)
    reporter = asyncio.create_task(report_progress("async", progress, len(specs)))
    started = time.monotonic()
    try:
        trajectories = await scheduler.run(specs)
    finally:
        reporter.cancel()
        await policy.close()
    wall = time.monotonic() - started
    tokens = sum(t.completion_tokens for tr in trajectories for t in tr.turns)
    failed = sum(tr.status is not Failure.OK for tr in trajectories)
    for tr in trajectories:
        if tr.status is not Failure.OK:
            logger.warning("async episode %s failed: %s %s", tr.episode_id, tr.status.value, tr.error)
    return Side("async", wall, len(trajectories), tokens, failed)


async def run_baseline(args: argparse.Namespace, base_url: str, workload: Workload) -> Side:
    """The same environment and policy client, in lockstep batches of `slots` episodes."""
    env = LatencyEnv(workload)
    policy = BudgetedPolicy(PolicyConfig(base_url=base_url, model=args.model), args.sessions)
    total = args.episodes

    def on_batch(done: int, batch_s: float) -> None:
        print(f"  lockstep: {done}/{total} episodes (batch took {batch_s:.1f} s)", file=sys.stderr, flush=True)

    started = time.monotonic()
    try:
        states = await run_lockstep(env, policy, make_tasks(total), args.slots, on_batch)
    finally:
        await policy.close()
    wall = time.monotonic() - started
    tokens = sum(t.completion_tokens for s in states for t in s.turns)
    return Side("lockstep", wall, len(states), tokens)


async def warm_up(args: argparse.Namespace, base_url: str) -> None:
    """A few requests so that neither side pays for the server's first batches."""
    policy = BudgetedPolicy(PolicyConfig(base_url=base_url, model=args.model), args.sessions)
    try:
        await policy.check_server()
        await asyncio.gather(*(policy.chat([{"role": "user", "content": f"Warm up {i}."}]) for i in range(8)))
    finally:
        await policy.close()


async def compare(args: argparse.Namespace, base_url: str) -> tuple[Side, Side]:
    workload = workload_for(args)
    print(
        f"workload: {args.episodes} episodes, {args.slots} slots, {args.sessions} sessions, {workload}",
        file=sys.stderr,
        flush=True,
    )
    await warm_up(args, base_url)
    with tempfile.TemporaryDirectory(prefix="baton-bench-log-") as log_dir:
        fast = await run_async(args, base_url, workload, Path(log_dir))
    print(f"  async done: {fast.wall_s:.1f} s", file=sys.stderr, flush=True)
    slow = await run_baseline(args, base_url, workload)
    print(f"  lockstep done: {slow.wall_s:.1f} s", file=sys.stderr, flush=True)
    return fast, slow


def main(argv: list[str] | None = None) -> int:
    bench_logging()
    args = parse_args(argv)
    with serve(args) as base_url:
        fast, slow = asyncio.run(compare(args, base_url))
    for side in (fast, slow):
        print(
            f"{side.name:>8}: {side.wall_s:7.1f} s  {side.episodes_per_s:6.2f} episodes/s  "
            f"{side.completion_tokens} completion tokens  {side.failed} failed"
        )
    if fast.failed or fast.completion_tokens != slow.completion_tokens:
        print("WARNING: the two sides did not do the same work (failures or token counts differ)")
    print(
        f"async_vs_lockstep: async is {slow.wall_s / fast.wall_s:.2f}x faster than lockstep "
        f"(wall {fast.wall_s:.1f} s vs {slow.wall_s:.1f} s; {fast.episodes_per_s:.2f} vs "
        f"{slow.episodes_per_s:.2f} episodes/s; {fast.episodes} episodes each)"
    )
    return 1 if fast.failed else 0


if __name__ == "__main__":
    sys.exit(main())
