"""scripts/run.sh end to end on the default model: `--debug-mode` against a vLLM started outside the run is
used, and still running afterwards. (`--rl-phase both` over two iterations, promotion, in-place reload, metrics,
plot and TensorBoard: the quickstart's test, tests/e2e/test_quickstart.py; Ctrl+C, then SIGTERM during the
clean-up, and a `--resume` whose vLLM dies under the rollout: tests/e2e/test_own_model.py's Qwen3 run.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollout_engine.layout import Layout
from tests.conftest import REPO, default_sigint
from tests.e2e.conftest import free_port, serves
from tests.waits import communicate_waiting, generation_s

pytestmark = pytest.mark.e2e

TINY = ["policy_config.max_new_tokens=32", "env_config.live_view=plain"]


def run_sh(data: Path, log: Path, *args: str, port: int | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "BATON_VLLM_PORT": str(port or free_port())}
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log), *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
        **popen,
    )


def finish(proc: subprocess.Popen, waiting_for: str, timeout: float) -> tuple[int, str]:
    out = communicate_waiting(proc, waiting_for=waiting_for, timeout=timeout)
    return proc.returncode, out


def journal(log: Path, split: str, iteration: int) -> list[dict]:
    path = Layout(log).journal(split, iteration, 0)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_debug_mode_uses_the_external_server_and_leaves_it_running(vllm_server, data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "exp"
    pgid = vllm_server.pgid()
    rc, out = finish(
        run_sh(
            data_dir,
            log,
            "--rl-phase",
            "rollout",
            "--rollout-split",
            "eval-only",
            "--max-iterations",
            "1",
            "--debug-mode",
            f"policy_config.base_url={vllm_server.base_url}",
            *TINY,
            "env_config.test_tasks_rollout_size=4",
        ),
        "run.sh --debug-mode to finish a 4-episode eval rollout",
        generation_s(4, 32),
    )
    assert rc == 0, out[-3000:]
    assert len(journal(log, "test", 1)) == 4
    assert not (log / "run" / "rank_0" / "logs" / "vllm.log").exists()
    os.killpg(pgid, 0)  # the external server's group is still there
    assert serves(vllm_server.port)
