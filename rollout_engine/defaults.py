"""One table of Baton's defaults and deadlines: each run.sh setting once, with its variable and unit.

    from rollout_engine.defaults import DEAD_AFTER_S
    parser.add_argument("--dead-after", type=float, default=DEAD_AFTER_S.default)

Every value is what run.sh uses when its variable is unset (docs/cli.md#environment
lists them for people). The driver (coordinator/driver/) reads each variable
through its Setting (`.value()`); tests/unit/test_defaults.py checks that the
driver spells none of them itself, that any `${BATON_X:-N}` left in scripts/
and docs/cli.md agree with this table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: a whole number in decimal digits, and one with a fraction (no sign, no spaces): what run.sh's numbers take
WHOLE = re.compile(r"[0-9]+")
DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class Setting:
    """A default run.sh's environment variable `env` can override."""

    env: str
    default: float
    #: what it sets, for the reader
    meaning: str
    #: the least value it takes, and the most (None: no bound)
    least: int = 0
    most: int | None = None
    #: a number of seconds that may have a fraction (the protocol's timings; read with `seconds`), else whole
    fraction: bool = False

    def value(self, env: Mapping[str, str] = os.environ) -> int:
        """The setting for this run: its variable when set (the driver validated it up front), else the default."""
        text = env.get(self.env, "")
        return int(text) if text.strip() else int(self.default)

    def seconds(self, env: Mapping[str, str] = os.environ) -> float:
        """A `fraction` setting for this run: its variable when set, else the default."""
        text = env.get(self.env, "")
        return float(text) if text.strip() else float(self.default)

    def problem(self, text: str) -> str:
        """What is wrong with `text` as this setting's value ("" when nothing): run.sh checks every variable set
        before anything starts (coordinator/driver/cli.py `validate_env`)."""
        if self.fraction:
            if DECIMAL.fullmatch(text) and float(text) > 0:
                return ""
            must = "a number of seconds > 0"
        elif WHOLE.fullmatch(text) and self.least <= int(text) and (self.most is None or int(text) <= self.most):
            return ""
        elif self.most is None:
            must = f"a whole number >= {self.least}"
        elif (self.least, self.most) == (0, 1):
            must = "0 or 1"
        else:
            must = f"a whole number from {self.least} to {self.most}"
        return f"{self.env} must be {must} (got '{text}')"

    def given(self, env: Mapping[str, str] = os.environ) -> bool:
        """Whether this run's environment sets the variable (a default that depends on the run needs to know)."""
        return bool(env.get(self.env, "").strip())


# Several nodes (coordinator: membership, heartbeat, barrier)
HEARTBEAT_S = Setting("BATON_HEARTBEAT_S", 5, "seconds between a node's heartbeats", fraction=True)
DEAD_AFTER_S = Setting(
    "BATON_DEAD_AFTER_S", 30, "seconds of unchanged heartbeat after which a rank is dead", fraction=True
)
JOIN_WAIT_S = Setting("BATON_JOIN_WAIT_S", 600, "seconds a worker waits for its master to publish the run", 1)
START_SPREAD_S = Setting(
    "BATON_START_SPREAD_S", 60, "seconds over which the nodes' starts are spread (unset: from 64 nodes on; 0: none)"
)
FS_CHECK_S = Setting(
    "BATON_FS_CHECK_S", 10, "seconds the shared-filesystem check at a multi-node start may take (0: no check)"
)
# Serving
VLLM_PORT = Setting("BATON_VLLM_PORT", 8999, "this node's vLLM port", 1, 65535)
VLLM_START_S = Setting("BATON_VLLM_START_S", 600, "seconds vLLM has to answer its health check, per attempt", 1)
VLLM_RELOAD_S = Setting("BATON_VLLM_RELOAD_S", 600, "seconds an in-place weight reload may take", 1)
VLLM_ENGINE_FORK = Setting(
    "BATON_VLLM_ENGINE_FORK", 1, "1: on a CPU with the uni executor, vLLM's engine core is forked; 0: spawned", 0, 1
)
# Phases
CHECK_TIMEOUT_S = Setting("BATON_CHECK_TIMEOUT_S", 900, "seconds the update-check may take", 1)
MODEL_DOWNLOAD_S = Setting("BATON_MODEL_DOWNLOAD_S", 21600, "seconds a download of the model from the Hub may take", 1)
ROLLOUT_STALL_S = Setting("BATON_ROLLOUT_STALL_S", 900, "seconds a rollout may go without finishing an episode")
ROLLOUT_TIMEOUT_S = Setting("BATON_ROLLOUT_TIMEOUT_S", 0, "seconds a whole rollout may take (0: no limit)")
POLICY_RESTARTS = Setting("BATON_POLICY_RESTARTS", 3, "times one rollout is resumed after its server stopped")
UPDATE_POLL_S = Setting("BATON_UPDATE_POLL_S", 30, "how often --rl-phase update looks for a new train rollout", 1)
WARM_TRAINER = Setting(
    "BATON_WARM_TRAINER", 1, "1: one trainer per run and node trains every update in the same processes; 0: fresh", 0, 1
)
TRAINER_START_S = Setting(
    "BATON_TRAINER_START_S", 300, "seconds the warm trainer has to start before updates run fresh", 1
)
# Progress
PROGRESS_S = Setting("BATON_PROGRESS_S", 30, "seconds between the live view's plain lines (0: off)")

SETTINGS = (
    HEARTBEAT_S,
    DEAD_AFTER_S,
    JOIN_WAIT_S,
    VLLM_PORT,
    VLLM_START_S,
    VLLM_RELOAD_S,
    VLLM_ENGINE_FORK,
    CHECK_TIMEOUT_S,
    MODEL_DOWNLOAD_S,
    ROLLOUT_STALL_S,
    ROLLOUT_TIMEOUT_S,
    POLICY_RESTARTS,
    UPDATE_POLL_S,
    WARM_TRAINER,
    TRAINER_START_S,
    PROGRESS_S,
)
#: every variable of the table, the two that only some runs read included (checked up front: coordinator/driver/cli.py)
EVERY_SETTING = (*SETTINGS, FS_CHECK_S, START_SPREAD_S)

#: seconds between a waiting barrier's progress lines ("waiting for ranks 1 (631 s)")
BARRIER_REPORT_S = 30.0
#: a heartbeat unchanged this long is shown as trouble (three beats at the default interval)
BEAT_TROUBLE_S = 3 * HEARTBEAT_S.default
