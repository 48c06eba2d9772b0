"""Group-relative advantages (GRPO): each episode's reward against the other samples of its task.

    group_advantages([1.0, 0.0, 0.0, 1.0])          # [0.866, -0.866, -0.866, 0.866]
    group_advantages([1.0, 0.0], scale_by_std=False)  # [0.5, -0.5]  (Dr. GRPO: centred, not scaled)
    group_advantages([0.0, 0.0, 0.0])                # None: no reward differs, nothing to learn from

A group is the `n_samples_per_task` samples of one task in one iteration; the selector
(training.selection.GroupSelector) forms the groups, drops and counts the ones this returns None for, and gives
every step of an episode the episode's advantage. Pure Python.
"""

from __future__ import annotations

import math

from rollout_engine.types import Trajectory

#: added to the standard deviation (GRPO's epsilon: TRL and verl use 1e-4 and 1e-6): a group of near-equal
#: rewards does not blow up
STD_EPS = 1e-6


def episode_return(traj: Trajectory) -> float:
    """The episode's reward: the environment's score (`Score.reward`: reasoning-gym's scorer, TextWorld's share of
    the points, MiniWoB's reward, a judge's verdict); a success an environment reports with reward 0 counts 1."""
    if traj.reward == 0.0 and traj.success:
        return 1.0
    return float(traj.reward)


def group_advantages(rewards: list[float], scale_by_std: bool = True) -> list[float] | None:
    """(r - mean) / (std + STD_EPS) for each reward of one group, with the sample standard deviation (n - 1, as
    TRL and verl compute it); without `scale_by_std`, r - mean (Dr. GRPO: the division favours groups that are
    nearly all right or all wrong). None when the rewards do not differ (one sample, or all equal)."""
    if len(rewards) < 2 or max(rewards) == min(rewards):
        return None
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + STD_EPS) for c in centred]
