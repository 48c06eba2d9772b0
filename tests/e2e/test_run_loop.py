"""scripts/run.sh end to end on the default model: real vLLM, rollout engine, LLaMA-Factory.
(`--rl-phase both` over two iterations, promotion, in-place reload, metrics, plot and TensorBoard: the
quickstart's test, tests/e2e/test_quickstart.py.)

- SIGINT during a rollout, then SIGTERM during the clean-up: run.sh exits (130) within 30 s
  with nothing of it left;
  `--resume` completes the iteration without duplicate episodes, though vLLM is SIGKILLed
  under it: run.sh restarts vLLM and resumes, and no episode is failed for it.
- `--debug-mode` against a vLLM started outside the run: used, and still
  running afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rollout_engine.layout import Layout
from tests.conftest import REPO, default_sigint
from tests.e2e.conftest import free_port, processes_mentioning
from tests.waits import VLLM_START_S, communicate_waiting, generation_s

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


def serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3):
            return True
    except OSError:
        return False


def journaled_more(log: Path, before: int, proc: subprocess.Popen, timeout: float) -> None:
    """Wait (polling fast) until the eval journal of iteration 1 holds more than `before` episodes."""
    path = log / "trajectories" / "test" / "iter_0001" / "rank_0.jsonl"
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().count("\n") > before):
        assert proc.poll() is None and time.monotonic() < deadline, (
            f"no episode journaled after {before} in {timeout} s"
        )
        time.sleep(0.02)


def signal_group(log: Path, name: str, sig: signal.Signals) -> None:
    """Signal a process group the run recorded (run/rank_0/pids/<name>.pgid)."""
    os.killpg(int((log / "run" / "rank_0" / "pids" / f"{name}.pgid").read_text().split()[0]), sig)


def test_sigint_during_rollout_stops_everything_then_resume_completes(data_dir: Path, tmp_path: Path) -> None:
    """The rollout is held (SIGSTOP) right after the episode the test waits for, so that it is mid-rollout
    when the test acts, however fast the machine; run.sh's clean-up and the next run resume it (SIGCONT)."""
    log, port = tmp_path / "exp", free_port()
    args = ["--rl-phase", "rollout", "--rollout-split", "eval-only", "--max-iterations", "1", *TINY]
    args += ["env_config.test_tasks_rollout_size=48"]
    proc = run_sh(data_dir, log, *args, port=port)
    journaled_more(log, 0, proc, VLLM_START_S + generation_s(8, 32))
    signal_group(log, "rollout-test", signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # clean-up under way (it stops the rollout, then vLLM): a second signal must not cut it short
    proc.send_signal(signal.SIGTERM)
    # it stops in seconds (each group SIGTERM, SIGKILL after 10 s: docs/cli.md); 120 s only catches a clean-up
    # that does not end
    rc, out = finish(proc, "run.sh to stop after Ctrl+C and a SIGTERM", 120)
    assert rc == 130, out[-3000:]  # the first signal's code: the second was ignored during clean-up
    assert not processes_mentioning(str(log), f"--port {port}") and not serves(port)
    partial = len(journal(log, "test", 1))
    assert 0 < partial < 48

    # --resume; the policy server dies under the resumed rollout: its whole group SIGKILLed while the rollout
    # is held after its next episode, then the rollout goes on against the dead server
    budget = 2 * VLLM_START_S + generation_s(48, 32)
    resumed = run_sh(data_dir, log, *args, "--resume", port=port)
    journaled_more(log, partial, resumed, VLLM_START_S + generation_s(8, 32))
    signal_group(log, "rollout-test", signal.SIGSTOP)
    signal_group(log, "vllm", signal.SIGKILL)
    signal_group(log, "rollout-test", signal.SIGCONT)
    rc, out = finish(resumed, "run.sh --resume to restart vLLM and finish the rollout", budget)
    assert rc == 0, out[-3000:]
    assert "the policy server stopped answering during the test rollout; restarting vLLM and resuming" in out
    rows = journal(log, "test", 1)
    assert not [t["episode_id"] for t in rows if t["status"] == "model_error"]  # the dead server failed no episode
    ids = [t["episode_id"] for t in rows]
    assert len(ids) == len(set(ids)) == 48
    manifest = json.loads((log / "trajectories" / "test" / "iter_0001" / "rank_0.manifest.json").read_text())
    assert manifest["complete"] and manifest["episodes"] == 48
    assert not (log / "trajectories" / "test" / "iter_0002").exists()
    assert not processes_mentioning(str(log), f"--port {port}")


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
