"""Re-assigning a dead rank's unfinished episodes to the survivors of a multi-node rollout.

Used by --on-rank-failure continue: the driver's takeover (coordinator/driver/rollout.py) calls it.

    share = DeadShare(planned=("a#0", "b#0", "c#0", "d#0"), done=frozenset({"a#0"}))
    reassign([1, 1, 2], {1: share}, survivors=[0, 2])        # {1: {0: ["b#0"], 2: ["c#0", "d#0"]}}
    plan = plan_takeover(cfg, dead=[1], survivors=[0, 2])    # cuts rank_1.jsonl, writes takeover.json

`reassign` is pure: for each dead rank, the episodes of its planned order that are not
journaled up to its cut are split among the survivors by their rank weights with the rule
that splits the tasks among the ranks (largest remainder, contiguous shares, ties to the lower
rank): the shares are disjoint and sum to the unfinished count. `plan_takeover` gets the inputs
from the files: the dead rank's share as any rank plans it from the same config (same seed,
same sampling: rollout_engine.tasks.plan_rank), its journal's cut (rollout_engine.takeover.cut_journal:
only complete lines count), and writes the plan atomically to
`trajectories/<split>/iter_NNNN/takeover.json` (format: rollout_engine.takeover, docs/formats.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from rollout_engine.config import RolloutConfig
from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout, journal_name
from rollout_engine.takeover import (
    DeadRank,
    TakeoverPlan,
    cut_journal,
    save_takeover_plan,
    takeover_plan_path,
)
from rollout_engine.tasks import largest_remainder, load_tasks, plan_rank, tasks_path


@dataclass(frozen=True)
class DeadShare:
    """A dead rank's part of the iteration: its episode ids in planned order, and those journaled up to its cut."""

    planned: tuple[str, ...]
    done: Collection[str]

    def unfinished(self) -> list[str]:
        """The planned ids not journaled, in planned order."""
        done = set(self.done)
        return [episode_id for episode_id in self.planned if episode_id not in done]


def check_ranks(rank_weights: Sequence[float], dead: Collection[int], survivors: Sequence[int]) -> None:
    """ConfigError listing every problem with the ranks of a re-assignment."""
    ranks = range(len(rank_weights))
    problems = [
        f"rank {r} is not a rank of rank_weights={list(rank_weights)}" for r in [*dead, *survivors] if r not in ranks
    ]
    both = sorted(set(dead) & set(survivors))
    if both:
        problems.append(f"ranks {both} are both dead and survivors; a rank is one or the other")
    if len(set(survivors)) != len(survivors):
        problems.append(f"survivors repeat a rank (got {list(survivors)}); name each once")
    if not survivors or not any(rank_weights[s] > 0 for s in survivors if s in ranks):
        problems.append(
            f"no survivor has a weight > 0 (survivors {list(survivors)}, rank_weights={list(rank_weights)}): "
            "nobody can take over; stop the run and --resume it instead"
        )
    if problems:
        raise ConfigError(problems)


def share_among(
    episode_ids: Sequence[str], rank_weights: Sequence[float], survivors: Sequence[int]
) -> dict[int, list[str]]:
    """`episode_ids` in contiguous shares by the survivors' weights (largest remainder), the lowest rank first;
    every survivor has a list (maybe empty)."""
    order = sorted(survivors)
    counts = largest_remainder(len(episode_ids), [rank_weights[s] for s in order])
    shares: dict[int, list[str]] = {}
    start = 0
    for survivor, count in zip(order, counts, strict=True):
        shares[survivor] = list(episode_ids[start : start + count])
        start += count
    return shares


def reassign(
    rank_weights: Sequence[float], dead: Mapping[int, DeadShare], survivors: Sequence[int]
) -> dict[int, dict[int, list[str]]]:
    """Dead rank -> survivor -> the dead rank's unfinished episode ids that survivor rolls out.

    Deterministic: survivors by rank, each dead rank's unfinished episodes in its planned order.
    ConfigError for ranks that do not fit `rank_weights`.
    """
    check_ranks(rank_weights, list(dead), survivors)
    return {d: share_among(share.unfinished(), rank_weights, survivors) for d, share in sorted(dead.items())}


def plan_takeover(cfg: RolloutConfig, dead: Sequence[int], survivors: Sequence[int]) -> TakeoverPlan:
    """Cut each dead rank's journal now, re-assign its unfinished episodes, write takeover.json; return the plan.

    `cfg` is any rank's config of this (split, iteration) (its `rank` is ignored): every rank plans
    every share alike.
    """
    check_ranks(cfg.rank_weights, dead, survivors)
    directory = Layout(cfg.log_path).iteration_dir(cfg.split, cfg.iteration)
    tasks = load_tasks(tasks_path(cfg), f"env_config.{cfg.split}_tasks")
    cuts = {d: cut_journal(directory / journal_name(d)) for d in sorted(set(dead))}
    shares = {
        d: DeadShare(tuple(s.episode_id for s in plan_rank(tasks, cfg, d)), cut.episode_ids) for d, cut in cuts.items()
    }
    assignments = reassign(cfg.rank_weights, shares, survivors)
    plan = TakeoverPlan(
        split=cfg.split,
        iteration=cfg.iteration,
        rank_weights=list(cfg.rank_weights),
        dead={d: DeadRank(cuts[d], len(shares[d].planned), assignments[d]) for d in cuts},
    )
    save_takeover_plan(takeover_plan_path(directory), plan)
    return plan
