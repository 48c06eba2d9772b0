"""TextWorld end to end: the real engine rolls out generated games against a real vLLM."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollout_engine.envs.textworld import build_tasks
from tests.conftest import REPO, env_python
from tests.e2e.conftest import VllmServer
from tests.waits import generation_s, run_waiting

pytestmark = pytest.mark.e2e

N_TASKS, N_SAMPLES, MAX_STEPS = 3, 2, 4


def run_engine(server: VllmServer, data: Path, log: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [
        env_python("app"),
        "-m",
        "rollout_engine",
        "--config-name",
        "rollout_test",
        "env=textworld",
        f"data_path={data}",
        f"log_path={log}",
        "env_config.test_tasks=tasks/textworld.jsonl",
        f"env_config.n_samples_per_task={N_SAMPLES}",
        "env_config.server_size=4",
        "env_config.live_view=plain",
        f"policy_config.base_url={server.base_url}",
        f"policy_config.model={server.model}",
        "policy_config.max_new_tokens=24",
        f"env.max_steps={MAX_STEPS}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    games = len((data / "tasks" / "textworld.jsonl").read_text().splitlines()) * N_SAMPLES
    return run_waiting(
        command,
        waiting_for=f"a TextWorld rollout of {games} episodes of at most {MAX_STEPS} turns",
        timeout=generation_s(games, 24, turns=MAX_STEPS),
        cwd=REPO,
        env=env,
    )


def test_engine_rolls_out_textworld_games(vllm_server: VllmServer, tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "log"
    rows = build_tasks(N_TASKS, seed=7, nb_rooms=2, nb_objects=3, quest_length=1)
    (data / "tasks").mkdir(parents=True)
    (data / "tasks" / "textworld.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    done = run_engine(vllm_server, data, log)

    assert done.returncode == 0, done.stderr[-3000:]
    journal = log / "trajectories" / "test" / "iter_0000" / "rank_0.jsonl"
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert len(lines) == N_TASKS * N_SAMPLES
    assert {line["task_id"] for line in lines} == {row["task_id"] for row in rows}
    for line in lines:
        assert line["status"] == "ok", line["error"]
        assert line["env"] == "textworld" and 1 <= len(line["turns"]) <= MAX_STEPS
        assert line["success"] == line["info"]["won"]
        turn_rewards = sum(turn["reward"] for turn in line["turns"])
        assert line["reward"] == pytest.approx(turn_rewards / line["info"]["max_score"])
        first = line["turns"][0]
        assert first["messages"][0]["role"] == "system" and "Available commands:" in first["messages"][1]["content"]
        assert first["completion_token_ids"], "vLLM token ids are recorded"
        for turn in line["turns"]:
            assert turn["invalid_action"] == (turn["action"]["command"] is None)
            assert turn["observation"] and not turn["observation"].lstrip().startswith(">")
            if turn["invalid_action"]:
                assert turn["state_changed"] is False
    games = sorted(path.name for path in (data / "textworld" / "games").iterdir())
    assert len(games) == N_TASKS, "each game is generated once and cached by its settings"
    metrics = json.loads((log / "metrics.jsonl").read_text().splitlines()[-1])
    assert "invalid_action_rate" in json.dumps(metrics)
