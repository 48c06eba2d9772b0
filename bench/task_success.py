"""How often a rollout succeeds, per episode and per task, and how likely a round of a given size has no success.

    PYTHONPATH=. $BATON_APP_PY -m bench.task_success --log-path L [--iterations 1,2] [--round 24x4 --round 96x1]

RFT trains on successes, so an update whose rollout found none is skipped. Successes cluster by task: a task the
policy cannot do fails all its samples, so `tasks x samples` episodes are far from that many independent tries.
From a rollout of many tasks with several samples each (docs/benchmarks.md §3h), this prints the success per
episode, how many tasks had 0, 1, ... of their samples succeed, and for each `--round TASKSxSAMPLES` the chance
that a round drawn uniformly from these tasks has no success at all: the mean over seeded draws of the product of
(1 - p)^samples over the drawn tasks, p each task's observed rate shrunk toward the mean by one episode's weight
(a task seen failing 4 times is not certain to fail). Infrastructure failures (status not ok) are left out.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from rollout_engine.history import load_trajectories
from rollout_engine.types import Failure, Trajectory

#: draws of a round when estimating its chance of no success
DRAWS = 20_000


@dataclass(frozen=True)
class Rates:
    """Each task's outcomes (True = success) over the episodes read."""

    outcomes: dict[str, list[bool]]

    @classmethod
    def of(cls, trajectories: list[Trajectory]) -> Rates:
        outcomes: dict[str, list[bool]] = defaultdict(list)
        for t in trajectories:
            if t.status is Failure.OK:
                outcomes[t.task_id].append(t.success)
        return cls(dict(outcomes))

    def per_episode(self) -> float:
        runs = [s for v in self.outcomes.values() for s in v]
        return sum(runs) / len(runs) if runs else 0.0

    def histogram(self) -> dict[int, int]:
        """Tasks by how many of their episodes succeeded."""
        return dict(sorted(Counter(sum(v) for v in self.outcomes.values()).items()))

    def shrunk(self) -> dict[str, float]:
        """Each task's rate with one pseudo-episode at the mean rate: (successes + mean) / (episodes + 1)."""
        mean = self.per_episode()
        return {task: (sum(v) + mean) / (len(v) + 1) for task, v in self.outcomes.items()}

    def none_in_round(self, tasks: int, samples: int, seed: int = 0, draws: int = DRAWS) -> float:
        """The chance that `tasks` distinct tasks drawn uniformly, `samples` episodes each, have no success."""
        rates = self.shrunk()
        ids = sorted(rates)
        tasks = min(tasks, len(ids))
        rng = random.Random(seed)
        total = 0.0
        for _ in range(draws):
            total += math.prod((1.0 - rates[t]) ** samples for t in rng.sample(ids, tasks))
        return total / draws


def parse_round(text: str) -> tuple[int, int]:
    tasks, _, samples = text.partition("x")
    if not (tasks.isdigit() and samples.isdigit() and int(tasks) > 0 and int(samples) > 0):
        raise argparse.ArgumentTypeError(f"--round takes TASKSxSAMPLES, e.g. 24x4 (got {text!r})")
    return int(tasks), int(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.task_success", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-path", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--iterations", default="1", help="comma-separated iterations to read (default: 1)")
    parser.add_argument("--round", type=parse_round, action="append", default=[], help="TASKSxSAMPLES, repeatable")
    args = parser.parse_args(argv)
    iterations = [int(i) for i in args.iterations.split(",")]
    rates = Rates.of(load_trajectories(args.log_path, args.split, iterations))
    if not rates.outcomes:
        raise SystemExit(f"no {args.split} episodes in {args.log_path} iterations {args.iterations}")
    episodes = sum(len(v) for v in rates.outcomes.values())
    print(f"{episodes} episodes of {len(rates.outcomes)} tasks: success {100 * rates.per_episode():.1f} % per episode")
    print("tasks by successes: " + ", ".join(f"{k}: {n}" for k, n in rates.histogram().items()))
    for tasks, samples in args.round or [(24, 4), (48, 2), (96, 1)]:
        print(f"a round of {tasks} tasks x {samples}: no success with chance {rates.none_in_round(tasks, samples):.1e}")


if __name__ == "__main__":
    main()
