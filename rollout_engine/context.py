"""What an environment knows about the run it is part of.

The engine builds environments as `factory(context=RunContext(...))` (see
`rollout_engine.config`); the context gives the split, iteration, rank and
seed, where to write files (screenshots go under `images_dir(episode_id)`),
the difficulty-to-step-budget mapping of this split, the judge settings and
the policy's model (`model`: its reasoning and chat template arguments, which
a judge that is the policy server uses too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rollout_engine.config import ModelConfig, OpenAIConfig, PolicyConfig, StepBudget
from rollout_engine.types import Task


@dataclass(frozen=True)
class RunContext:
    """Read-only facts about one rollout, handed to the environment's constructor."""

    split: str
    iteration: int
    rank: int
    seed: int
    data_path: Path
    #: trajectories/<split>/iter_<NNNN>/ under the log path
    log_dir: Path
    step_budget: StepBudget = field(default_factory=StepBudget)
    judge: OpenAIConfig = field(default_factory=OpenAIConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    def images_dir(self, episode_id: str) -> Path:
        """Directory for one episode's screenshots (created by the caller when it writes one)."""
        return self.log_dir / "images" / episode_id.replace("/", "_")

    def max_steps(self, task: Task) -> int:
        """The task's own `metadata.max_steps`, else this split's budget for its difficulty."""
        own = task.metadata.get("max_steps")
        return int(own) if own else self.step_budget.for_difficulty(task.difficulty)
