"""What one run.sh run knows, in one place: its arguments, paths, children and counters.

`Run` holds what the phases share (the Bash loop kept it in globals). It is built once by
`run.main` (after the command line is valid and the configuration composed) and handed
to the loop; nothing else holds the run's state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.driver.cli import Args
from coordinator.driver.nodes import Node
from coordinator.driver.procs import Groups, child_env
from coordinator.driver.supervise import Supervisor
from coordinator.driver.trainer import WarmTrainer
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import ServerSettings
from rollout_engine.defaults import VLLM_PORT
from rollout_engine.layout import Layout


@dataclass(frozen=True)
class Pythons:
    """The three environments' interpreters (run.sh's envs_export put them in the environment)."""

    app: str
    serve: str
    train: str

    @classmethod
    def from_env(cls) -> Pythons:
        return cls(os.environ["BATON_APP_PY"], os.environ["BATON_SERVE_PY"], os.environ["BATON_TRAIN_PY"])


@dataclass
class Composed:
    """The configuration composed once (coordinator/overrides.py): each config's overrides, the policy, and
    vllm_config resolved for this node (`vllm.max_model_len`: the context this node's vLLM serves, a plain
    int; None when this run serves no policy: --debug-mode, --rl-phase update)."""

    rollout: list[str]
    update: list[str]
    base_url: str
    model: str
    max_sessions: int
    trackers: list[str]
    vllm: ServerSettings | None = None


@dataclass
class Step:
    """What one step of the plan does (the master decides; a worker receives it)."""

    iteration: int = 0
    train: bool = False
    eval: bool = False
    update: bool = False
    final: bool = False
    resume: bool = False
    #: planned without this node (continue mode): it waits for the next step
    skip: bool = False


@dataclass
class Run:
    args: Args
    root: str
    pythons: Pythons
    composed: Composed
    groups: Groups
    supervisor: Supervisor
    node: Node
    server: PolicyServer | None
    base_model: str
    port: int = field(default_factory=lambda: VLLM_PORT.value())
    #: the roles this run takes (rollout and/or update), and those it owns in its rank's run directory
    roles: list[str] = field(default_factory=list)
    #: the roles this run.sh owns in its rank's run directory (rollout, update)
    claimed: list[str] = field(default_factory=list)
    #: the process groups a clean-up stops (named per role: a rollout and an update run share the directory)
    group_names: list[str] = field(default_factory=list)
    watch_name: str = "watch"
    dashboard_name: str = ""
    #: a worker serves the version the master's plan names ("" for the base model)
    pinned: bool = False
    pin_version: str = ""
    served_version: str | None = None
    serve_how: str = ""
    #: updates failed in a row (toward --max-update-failures)
    failures: int = 0
    #: the last update's iteration when it failed; 0 when it promoted or was skipped (the run's exit reads it)
    failed_iteration: int = 0
    done: int = 0
    final_done: bool = False
    #: where the run is (for the failure flag a node leaves on its way out)
    iteration: int = 0
    phase: str = "start"
    update_running: int = 0
    #: torchrun's node count and this node's place in it (a continue run trains on the step's members)
    train_nodes: int = 0
    train_rank: int | None = None
    rank_weights: list[int] = field(default_factory=list)
    last_error: str = ""
    #: what <log>/model.json pins: the model this node serves and trains (coordinator.model.model_record)
    model_record: dict = field(default_factory=dict)
    #: the warm trainer (coordinator/driver/trainer.py), from the first single-node update on
    trainer: WarmTrainer | None = None

    @property
    def layout(self) -> Layout:
        return Layout(self.args.log)

    @property
    def log(self) -> str:
        return self.args.log

    @property
    def rank(self) -> int:
        return self.args.rank

    @property
    def run_dir(self) -> Path:
        return self.layout.rank_dir(self.args.rank)

    def env(self) -> dict[str, str]:
        """The environment of a Baton child: ours, with the repository first on PYTHONPATH, then the user's."""
        return child_env(self.root)

    def policy_version(self) -> str:
        """The version to serve and fine-tune: the pinned one, else policy/current's ("" for the base model)."""
        if self.pinned:
            return self.pin_version
        link = self.layout.policy_current
        if not link.is_symlink():
            return ""
        target = os.readlink(link)
        digits = target[1:] if target.startswith("v") else ""
        return str(int(digits)) if digits.isdigit() else ""

    def policy_path(self) -> str:
        version = self.policy_version()
        if not version:
            return self.base_model
        if self.pinned:
            return str(self.layout.policy_version(int(version)))
        return os.path.realpath(self.layout.policy_current)

    def hydra_weights(self) -> str:
        return "[" + ",".join(str(w) for w in self.rank_weights) + "]"
