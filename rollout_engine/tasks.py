"""Task files, samplers and the split of one iteration's work across ranks.

- `load_tasks(path)`: a JSONL task file (docs/formats.md); any bad line is a
  `ConfigError` naming the file and line.
- `sample_tasks(...)`: train `uniform` (without replacement), `ratio`
  (difficulty buckets, counts by largest remainder) or `learnable` (families
  weighted by p(1-p) of their recent success rate); test = the first N in
  file order. The random generator is seeded from (run seed, iteration, split)
  only, so a restarted rollout samples exactly the same tasks (resume needs it).
- `split_for_rank(...)`: every sampled task goes to exactly one rank; rank r
  gets a contiguous share of size ~ n * w_r / W (largest remainder, no loss).
- `scale_limit(...)`: this rank's `server_size` / `max_vllm_sessions`: per node
  (`env_config.limits_scope=node`, the default) or a share of a cluster total
  (`cluster`: largest remainder, each rank with weight > 0 at least 1).
- `plan_episodes(...)`: the episodes of this rank: every task times its
  samples (`n_samples_per_task`, times `test_tasks_repeat_times` on test),
  hardest first if asked.
- `plan_rank(tasks, cfg, rank)`: all of the above for any rank's share: every
  rank computes every share alike (same seed, same sampling), so a survivor can
  plan a dead rank's episodes (rollout_engine.takeover).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

from rollout_engine.config import DifficultyBucket, EnvConfig, RolloutConfig, cluster_limit_problem
from rollout_engine.errors import ConfigError
from rollout_engine.history import load_trajectories
from rollout_engine.inputs import input_lines, read_input
from rollout_engine.types import EpisodeSpec, Failure, Task, Trajectory


def _task_from_line(path: Path, number: int, line: str) -> Task:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"task file {where} is not valid JSON ({exc.msg}; got {line.strip()[:80]!r}); fix or remove that line"
        ) from None
    if not isinstance(row, dict):
        raise ConfigError(f"task file {where} must hold a JSON object (got {type(row).__name__}); fix that line")
    for key in ("task_id", "task_name"):
        if key not in row:
            raise ConfigError(f"task file {where} lacks the required field {key}; add it (docs/formats.md)")
        if row[key] in (None, ""):
            raise ConfigError(f"task file {where}: {key} must be a non-empty string (got {row[key]!r}); set it")
    for key in ("env", "family"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise ConfigError(f"task file {where}: {key} must be a string (got {row[key]!r}); fix that line")
    difficulty = row.get("difficulty", 1)
    if not isinstance(difficulty, int) or isinstance(difficulty, bool) or difficulty < 1:
        raise ConfigError(f"task file {where}: difficulty must be an integer >= 1 (got {difficulty!r})")
    if row.get("metadata") is not None and not isinstance(row["metadata"], dict):
        raise ConfigError(f"task file {where}: metadata must be an object (got {type(row['metadata']).__name__})")
    return Task.from_json(row)


def load_tasks(path: Path, field_name: str = "task file") -> list[Task]:
    """All tasks of a JSONL file (UTF-8, a BOM allowed), in file order; blank lines are skipped."""
    if not path.is_file():
        raise ConfigError(
            f"{field_name} does not exist (got {str(path)!r}); point it at a JSONL task file "
            "(relative paths are under data_path)"
        )
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    data = read_input(path, field_name, "point it at a readable JSONL task file")
    for number, line in input_lines(data, f"task file {path}", "one JSON task per line, docs/formats.md"):
        task = _task_from_line(path, number, line)
        if task.task_id in seen:
            raise ConfigError(
                f"task file {path}:{number} repeats task_id {task.task_id!r} "
                f"(first on line {seen[task.task_id]}); task ids must be unique"
            )
        seen[task.task_id] = number
        tasks.append(task)
    if not tasks:
        raise ConfigError(f"{field_name} holds no tasks (got {str(path)!r}); add at least one line")
    return tasks


def derive_seed(run_seed: int, iteration: int, split: str) -> int:
    """A 64-bit seed that depends only on (run seed, iteration, split)."""
    digest = hashlib.sha256(f"baton:{run_seed}:{iteration}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """Integer shares of `total` proportional to `weights` that sum to exactly `total` (ties: lower index)."""
    weight_sum = sum(weights)
    exact = [total * w / weight_sum for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def sample_uniform(tasks: list[Task], size: int, rng: random.Random) -> list[Task]:
    """`size` distinct tasks (all of them, shuffled, when size is 0 or too large)."""
    size = len(tasks) if size <= 0 else min(size, len(tasks))
    return rng.sample(tasks, size)


def sample_ratio(tasks: list[Task], size: int, buckets: dict[str, DifficultyBucket], rng: random.Random) -> list[Task]:
    """Per-bucket counts by weight (largest remainder), uniform inside each bucket, then shuffled."""
    names = sorted(buckets)
    size = len(tasks) if size <= 0 else size
    counts = largest_remainder(size, [buckets[n].weight for n in names])
    chosen: list[Task] = []
    for name, count in zip(names, counts, strict=True):
        pool = [t for t in tasks if buckets[name].low <= t.difficulty <= buckets[name].high]
        chosen.extend(rng.sample(pool, min(count, len(pool))))
    rng.shuffle(chosen)
    return chosen


#: a family's weight under the `learnable` sampler is p(1-p) + LEARNABLE_FLOOR: a family solved always or
#: never still gets about one task for every six of a family at p = 0.5, so that forgetting shows in the
#: rollouts and a first success can come
LEARNABLE_FLOOR = 0.05


def family_rates(trajectories: list[Trajectory]) -> dict[str, float]:
    """Each family's success rate over the episodes that ran to an outcome (infrastructure failures left out)."""
    runs: dict[str, list[bool]] = {}
    for t in trajectories:
        if t.status is Failure.OK:
            runs.setdefault(t.family, []).append(t.success)
    return {family: sum(outcomes) / len(outcomes) for family, outcomes in runs.items()}


def sample_learnable(tasks: list[Task], size: int, rates: dict[str, float], rng: random.Random) -> list[Task]:
    """`size` distinct tasks, each drawn with its family's weight p(1-p) + LEARNABLE_FLOOR, p its recent success
    rate (a family without one counts as p = 0.5): most rollouts go where the policy sometimes succeeds, so
    that RL on its successes has the most to learn from. Weighted without replacement (Efraimidis-Spirakis)."""
    size = len(tasks) if size <= 0 else min(size, len(tasks))

    def weight(task: Task) -> float:
        p = rates.get(task.family, 0.5)
        return p * (1.0 - p) + LEARNABLE_FLOOR

    keyed = sorted(((rng.random() ** (1.0 / weight(t)), i) for i, t in enumerate(tasks)), reverse=True)
    return [tasks[i] for _, i in keyed[:size]]


def sample_tasks(
    tasks: list[Task], cfg: EnvConfig, split: str, seed: int, rates: dict[str, float] | None = None
) -> list[Task]:
    """This iteration's tasks for every rank together; `rates` (family -> recent success rate) for the
    `learnable` sampler."""
    if split == "test":
        size = cfg.test_tasks_rollout_size
        return list(tasks if size <= 0 else tasks[:size])
    rng = random.Random(seed)
    if cfg.train_tasks_sampler == "ratio":
        return sample_ratio(tasks, cfg.train_tasks_rollout_size, cfg.difficulty_ratio, rng)
    if cfg.train_tasks_sampler == "learnable":
        return sample_learnable(tasks, cfg.train_tasks_rollout_size, rates or {}, rng)
    return sample_uniform(tasks, cfg.train_tasks_rollout_size, rng)


def recent_rates(cfg: RolloutConfig) -> dict[str, float] | None:
    """The `learnable` sampler's family success rates: the train rollouts of the last `learnable_window`
    iterations before this one, as the update reads them (a merged iteration only, on several nodes). None
    for any other sampler or split."""
    if cfg.split != "train" or cfg.env_config.train_tasks_sampler != "learnable":
        return None
    window = range(max(0, cfg.iteration - cfg.env_config.learnable_window), cfg.iteration)
    return family_rates(load_trajectories(cfg.log_path, "train", window))


def split_for_rank(tasks: list[Task], weights: list[float], rank: int) -> list[Task]:
    """Rank `rank`'s contiguous share; the shares of all ranks are disjoint and cover `tasks`."""
    counts = largest_remainder(len(tasks), weights)
    start = sum(counts[:rank])
    return tasks[start : start + counts[rank]]


def cluster_shares(total: int, weights: list[float], field_name: str) -> list[int]:
    """Shares of a cluster-wide limit that sum to exactly `total`: proportional to `weights` by largest
    remainder, every rank with weight > 0 at least 1 (taken from the largest share), weight 0 gets 0."""
    problem = cluster_limit_problem(field_name, total, weights)
    if problem:
        raise ConfigError(problem)
    shares = largest_remainder(total, weights)
    for i in (i for i, w in enumerate(weights) if w > 0):
        if shares[i] == 0:
            donor = max(range(len(shares)), key=lambda j: (shares[j], j))
            shares[donor] -= 1
            shares[i] = 1
    return shares


def scale_limit(value: int, weights: list[float], rank: int, scope: str, field_name: str) -> int:
    """This rank's `env_config.<field_name>`: the value itself with limits_scope=node (each node has its
    own vLLM and environments), its share of the cluster total with limits_scope=cluster."""
    if scope == "node":
        return value
    return cluster_shares(value, weights, field_name)[rank]


def rank_limits(cfg: RolloutConfig) -> tuple[int, int]:
    """This rank's (max_vllm_sessions, server_size)."""
    env, weights, rank = cfg.env_config, cfg.rank_weights, cfg.rank
    return (
        scale_limit(env.max_vllm_sessions, weights, rank, env.limits_scope, "max_vllm_sessions"),
        scale_limit(env.server_size, weights, rank, env.limits_scope, "server_size"),
    )


def tasks_path(cfg: RolloutConfig) -> Path:
    """The task file of this rollout's split (relative paths are under data_path)."""
    path = Path(getattr(cfg.env_config, f"{cfg.split}_tasks"))
    return path if path.is_absolute() else Path(cfg.data_path) / path


def plan_rank(tasks: list[Task], cfg: RolloutConfig, rank: int) -> list[EpisodeSpec]:
    """The episodes of rank `rank`'s share of this (split, iteration), in planned order."""
    seed = derive_seed(cfg.seed, cfg.iteration, cfg.split)
    sampled = sample_tasks(tasks, cfg.env_config, cfg.split, seed, recent_rates(cfg))
    return plan_episodes(split_for_rank(sampled, cfg.rank_weights, rank), cfg.env_config, cfg.split)


def plan_episodes(tasks: list[Task], cfg: EnvConfig, split: str) -> list[EpisodeSpec]:
    """Every (task, sample) of this rank, hardest first when `hardest_first` (stable otherwise)."""
    samples = cfg.n_samples_per_task * (cfg.test_tasks_repeat_times if split == "test" else 1)
    if split == "test" and cfg.test_greedy:
        samples = 1
    ordered = sorted(tasks, key=lambda t: -t.difficulty) if cfg.hardest_first else tasks
    return [EpisodeSpec(task, k) for task in ordered for k in range(samples)]
