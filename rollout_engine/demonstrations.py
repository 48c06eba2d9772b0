"""Write demonstrations: an environment's scripted expert played through the real episode loop.

    python -m rollout_engine.demonstrations --env textworld|miniwob --tasks T.jsonl --out DIR \\
        [--data-path D] [key=value ...]

For every task of the task file the environment (built from
`configs/env/<env>.yaml` exactly as a rollout builds it; `key=value` are Hydra
overrides of the rollout config, e.g. `env.max_steps=20`) gives its expert
(`Env.expert`: TextWorld replays the game's walkthrough, MiniWoB++ runs the
page solvers of `envs/miniwob_experts.py`), and `Env.run_episode` plays it:
the prompts are exactly what the policy sees, the replies are in the action
syntax the environment parses. Only successful episodes are kept. Writes, each
file atomically:

    DIR/demonstrations.jsonl   one baton.trajectory/1 line per kept episode (no token ids:
                               nothing was sampled; policy_model "expert:<name>")
    DIR/demonstrations.json    the summary: episodes, kept, success rate per family, why others failed
    DIR/images/<episode_id>/   screenshots with env.screenshots=true (kept episodes only)

The update mixes them in with `data.demonstrations=DIR` (docs/update.md).
Exit codes: 0 written; 2 bad input (config, task file, a task the
environment rejects, no task with an expert; nothing written); 3 the experts
solved no task (the summary says why; nothing to learn from).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine.build import build_context, build_env
from rollout_engine.config import RolloutConfig, register_configs, validate
from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env
from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.files import save_json, save_jsonl
from rollout_engine.images import MediaSettings, images_per_prompt
from rollout_engine.runner import check_tasks
from rollout_engine.tasks import load_tasks
from rollout_engine.types import DEMONSTRATIONS_FILE, Task, Trajectory

log = logging.getLogger(__name__)

SUMMARY_SCHEMA = "baton.demonstrations/1"
SUMMARY_NAME = "demonstrations.json"
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True)
class DemoRequest:
    """What to play and where to write it."""

    env: str
    tasks: Path
    out: Path
    data_path: Path
    overrides: list[str] = field(default_factory=list)


@dataclass
class DemoOutcome:
    """What the experts did: the kept trajectories and why the others were not kept."""

    kept: list[Trajectory] = field(default_factory=list)
    #: episode id -> why it was not kept
    failed: dict[str, str] = field(default_factory=dict)
    #: tasks whose environment has no expert for them
    no_expert: list[str] = field(default_factory=list)
    experts: set[str] = field(default_factory=set)

    def summary(self, req: DemoRequest, tasks: list[Task], wall_s: float) -> dict[str, Any]:
        played = len(tasks) - len(self.no_expert)
        families: dict[str, Counter[str]] = {}
        kept_ids = {t.task_id for t in self.kept}
        for task in tasks:
            if task.task_id not in self.no_expert:
                counts = families.setdefault(task.family or task.env or req.env, Counter())
                counts["episodes"] += 1
                counts["kept"] += int(task.task_id in kept_ids)
        return {
            "schema": SUMMARY_SCHEMA,
            "env": req.env,
            "tasks": str(req.tasks.resolve()),
            "tasks_sha256": hashlib.sha256(req.tasks.read_bytes()).hexdigest(),
            "overrides": list(req.overrides),
            "experts": sorted(self.experts),
            "episodes": played,
            "kept": len(self.kept),
            "success_rate": round(len(self.kept) / played, 4) if played else 0.0,
            "no_expert": self.no_expert,
            "by_family": {
                name: {**counts, "success_rate": round(counts["kept"] / counts["episodes"], 4)}
                for name, counts in families.items()
            },
            "failed": self.failed,
            "created_at": time.time(),
            "wall_s": round(wall_s, 2),
        }


def compose(req: DemoRequest) -> RolloutConfig:
    """The rollout config of env `req.env` with the request's overrides, validated as a rollout validates it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    base = [f"env={req.env}", f"data_path={req.data_path}", f"log_path={req.out}"]
    base.append(f"env_config.train_tasks={req.tasks}")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = hydra_compose(config_name="rollout_train", overrides=[*base, *req.overrides])
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"--env {req.env!r} with overrides {req.overrides}: {first}; use a file of configs/env/ and keys "
            "of the rollout config (docs/rollout.md)"
        ) from None
    return validate(cfg)


async def play(
    env: Env, task: Task, slot: int, timeout_s: float, outcome: DemoOutcome, media: MediaSettings | None = None
) -> None:
    """One expert episode of `task`; a success goes to `outcome.kept`, anything else to `outcome.failed`."""
    media = media or MediaSettings()
    episode_id = f"{task.task_id}#0"
    started = time.time()
    try:
        expert = await env.expert(task)
        if expert is None:
            outcome.no_expert.append(task.task_id)
            return
        outcome.experts.add(expert.name)
        episode = env.run_episode(
            task, slot, expert, episode_id=episode_id, media_root=media.root, images_per_prompt=media.per_prompt
        )
        state, score = await asyncio.wait_for(episode, timeout_s)
    except Exception as exc:  # one episode's failure is recorded, the others go on
        outcome.failed[episode_id] = f"{type(exc).__name__}: {exc}"
        return
    if not score.success:
        outcome.failed[episode_id] = f"ended without success (reward {score.reward}, {len(state.turns)} turns)"
        return
    outcome.kept.append(
        Trajectory(
            episode_id=episode_id,
            task_id=task.task_id,
            sample_index=0,
            split="train",
            iteration=0,
            rank=0,
            env=env.name,
            family=task.family,
            difficulty=task.difficulty,
            reward=score.reward,
            success=True,
            turns=list(state.turns),
            policy_model=f"expert:{expert.name}",
            started_at=started,
            finished_at=time.time(),
            info={**score.info, "invalid_actions": state.invalid_actions, "expert": expert.name},
        )
    )


async def play_all(
    env: Env, tasks: list[Task], slots: int, timeout_s: float, media: MediaSettings | None = None
) -> DemoOutcome:
    """Every task's expert episode, `slots` at a time (the environment's slots, as in a rollout)."""
    outcome = DemoOutcome()
    free: asyncio.Queue[int] = asyncio.Queue()
    for slot in range(slots):
        free.put_nowait(slot)

    async def one(task: Task) -> None:
        slot = await free.get()
        try:
            await play(env, task, slot, timeout_s, outcome, media)
        finally:
            free.put_nowait(slot)

    await env.start()
    try:
        await asyncio.gather(*(one(task) for task in tasks))
    finally:
        await env.close()
    order = {task.task_id: i for i, task in enumerate(tasks)}
    outcome.kept.sort(key=lambda t: order[t.task_id])
    return outcome


def save(req: DemoRequest, context: RunContext, outcome: DemoOutcome, summary: dict[str, Any]) -> None:
    """The journal and summary (atomically); screenshots of episodes not kept are removed."""
    for episode_id in outcome.failed:
        shutil.rmtree(context.images_dir(episode_id), ignore_errors=True)
    save_jsonl(req.out / DEMONSTRATIONS_FILE, [t.to_json() for t in outcome.kept])
    save_json(req.out / SUMMARY_NAME, summary)


async def write_demonstrations(req: DemoRequest) -> dict[str, Any]:
    """Check everything, play every expert episode, write the files; the summary, or ConfigError (nothing written)."""
    cfg = compose(req)
    tasks = load_tasks(req.tasks, "--tasks")
    context = dataclasses.replace(build_context(cfg), log_dir=req.out)
    env = build_env(cfg, context)
    check_tasks(env, tasks, req.tasks)
    started = time.monotonic()
    media = MediaSettings(context.log_dir, images_per_prompt(cfg.vllm_config.limit_mm_per_prompt))
    outcome = await play_all(env, tasks, cfg.env_config.server_size, cfg.env_config.episode_timeout_s, media)
    if len(outcome.no_expert) == len(tasks):
        raise ConfigError(
            f"--tasks {req.tasks}: env {req.env} has no expert for any of its {len(tasks)} tasks; give tasks it "
            "can solve (textworld: any game; miniwob: the pages of rollout_engine/envs/miniwob_experts.py SOLVERS)"
        )
    summary = outcome.summary(req, tasks, time.monotonic() - started)
    save(req, context, outcome, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="a file of configs/env/ (textworld, miniwob)")
    parser.add_argument("--tasks", required=True, type=Path, help="task file (JSON lines) to solve")
    parser.add_argument("--out", required=True, type=Path, help="folder for demonstrations.jsonl and .json")
    parser.add_argument("--data-path", type=Path, help="data path (TextWorld's game cache); default: --out")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the rollout config, e.g. env.max_steps=20")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out.resolve()
    req = DemoRequest(args.env, args.tasks.resolve(), out, (args.data_path or out).resolve(), list(args.overrides))
    try:
        summary = asyncio.run(write_demonstrations(req))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return Exit.BAD_INPUT
    log.info(
        "%d of %d expert episodes succeeded (%s); wrote %s",
        summary["kept"],
        summary["episodes"],
        ", ".join(f"{name} {c['kept']}/{c['episodes']}" for name, c in summary["by_family"].items()),
        out / DEMONSTRATIONS_FILE,
    )
    return Exit.OK if summary["kept"] else Exit.NONE_SOLVED


if __name__ == "__main__":
    sys.exit(main())
