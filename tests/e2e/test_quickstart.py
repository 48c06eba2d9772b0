"""README command 1, `bash scripts/quickstart.sh`, end to end with one short iteration (issue 11).

The script itself runs (setup, prepare, run.sh with the quickstart's settings, the table and the plot),
cut down by its documented override arguments (later overrides win) and `BATON_QUICKSTART_ITERATIONS=1`:
8 train tasks x 4, 8 held-out tasks, one optimizer step. Its data folder starts as hard links of the
session's prepared data (scripts/prepare.sh finds the model and tasks ready: it is run by the `data_dir`
fixture for real).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import processes_mentioning
from tests.waits import UPDATE_S, VLLM_START_S, generation_s, run_waiting

pytestmark = pytest.mark.e2e

SHORT = [
    "env_config.train_tasks_rollout_size=8",
    "env_config.test_tasks_rollout_size=8",
    "algorithm.max_steps=1",
    "algorithm.per_device_train_batch_size=1",
    "algorithm.num_train_epochs=1",
]


def test_quickstart_runs_one_short_iteration_with_its_final_evaluation(data_dir: Path, tmp_path: Path) -> None:
    subprocess.run(["cp", "-al", str(data_dir), str(tmp_path / "data")], check=True)
    env = {**os.environ, "BATON_QUICKSTART_ITERATIONS": "1", "BATON_PROGRESS_S": "0"}
    out = run_waiting(
        ["bash", str(REPO / "scripts/quickstart.sh"), "--dir", str(tmp_path), *SHORT],
        waiting_for="the quickstart's one iteration and final evaluation",
        timeout=VLLM_START_S + generation_s(8 * 4 + 8 + 8, 32) + UPDATE_S,
        cwd=REPO,
        env=env,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    (logs,) = (tmp_path / "logs").iterdir()
    # the quickstart's settings reached the run, and the overrides given after them won
    config = (logs / "run" / "rank_0" / "resolved.yaml").read_text()
    assert "test_greedy: true" in config and "learning_rate: 0.0001" in config
    assert "train_tasks_rollout_size: 8" in config and "max_steps: 1" in config
    metrics = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in metrics if r.get("kind") == "iteration"]
    # iteration 1 (train, held-out base, the update) and iteration 2, the final held-out evaluation only
    assert [r["iteration"] for r in records] == [1, 2]
    assert (records[0]["train_episodes"], records[0]["eval_episodes"]) == (32, 8)
    assert (records[1].get("train_episodes"), records[1]["eval_episodes"]) == (None, 8)
    # what it prints: the table (a row per iteration), the plot, the time
    assert "success per iteration" in out.stdout
    table = out.stdout.split("success per iteration", 1)[1].splitlines()
    assert [line.split()[0] for line in table if line.strip()[:1].isdigit()] == ["1", "2"]
    assert f"plot: {logs}/plots/success.png" in out.stdout and (logs / "plots" / "success.png").exists()
    assert "quickstart finished in" in text
    assert processes_mentioning(str(tmp_path)) == []
