"""Helpers for the rollout engine e2e tests: run the real CLI and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rollout_engine.layout import Layout
from tests.conftest import REPO, env_python
from tests.waits import generation_s, run_waiting

#: the engine's defaults for what a command does not override (configs/rollout_*.yaml, PolicyConfig)
DEFAULTS = {"rollout_test": (80, 1), "rollout_train": (64, 4)}
DEFAULT_MAX_NEW_TOKENS = 256


def rollout_cmd(config: str, data: Path, log: Path, base_url: str, *overrides: str) -> list[str]:
    return [
        env_python("app"),
        "-m",
        "rollout_engine",
        "--config-name",
        config,
        f"data_path={data}",
        f"log_path={log}",
        f"policy_config.base_url={base_url}",
        "policy_config.model=policy",
        "env_config.live_view=plain",
        *overrides,
    ]


def engine_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def rollout_work(cmd: list[str]) -> tuple[int, int]:
    """(episodes, max_new_tokens) of a rollout command, from its overrides and the configs' defaults."""
    config = cmd[cmd.index("--config-name") + 1]
    split = "test" if config == "rollout_test" else "train"
    tasks, samples = DEFAULTS[config]
    overrides = dict(arg.split("=", 1) for arg in cmd if "=" in arg and not arg.startswith("-"))
    size = int(overrides.get(f"env_config.{split}_tasks_rollout_size", tasks))
    samples = int(overrides.get("env_config.n_samples_per_task", samples))
    return (size if size > 0 else DEFAULTS["rollout_test"][0]) * samples, int(
        overrides.get("policy_config.max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    )


def run_rollout(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run the engine to its end, within a bound derived from its episodes and reply budget (tests/waits.py)."""
    episodes, tokens = rollout_work(cmd)
    return run_waiting(
        cmd,
        waiting_for=f"a rollout of {episodes} episodes of at most {tokens} tokens",
        timeout=timeout or generation_s(episodes, tokens),
        cwd=REPO,
        env=engine_env(),
    )


def journal_rows(log: Path, split: str = "test", iteration: int = 0, rank: int = 0) -> list[dict]:
    path = Layout(log).journal(split, iteration, rank)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_metrics(log: Path) -> dict:
    return json.loads((log / "metrics.jsonl").read_text().splitlines()[-1])
