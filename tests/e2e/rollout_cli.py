"""Helpers for the rollout engine e2e tests: run the real CLI and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, env_python


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


def run_rollout(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=timeout, check=False)


def journal_rows(log: Path, split: str = "test", iteration: int = 0, rank: int = 0) -> list[dict]:
    path = log / "trajectories" / split / f"iter_{iteration:04d}" / f"rank_{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_metrics(log: Path) -> dict:
    return json.loads((log / "metrics.jsonl").read_text().splitlines()[-1])
