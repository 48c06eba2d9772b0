"""E2E fixtures: a real vLLM server on the default model, started and stopped
through the product's own driver (coordinator/driver/vllm.py: PolicyServer, in this process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.sharedfs import SharedFs, shared_fs
from coordinator.driver import say
from coordinator.driver.procs import Groups
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from tests.conftest import REPO, env_python
from tests.waits import UPDATE_S, run_waiting


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: one optimizer step of RFT on whatever succeeded, with a rollout that makes a success near certain: 48 tasks
#: x 2 samples at temperature 0.5, none found about 7e-5 of the time (docs/benchmarks.md 3h: successes cluster by
#: task, so more tasks with fewer samples each; a group of 2 still gives grpo a success beside a failure). Every
#: success, not only the shortest per task: the token-fidelity check drops replies that re-tokenize differently
#: (runs of newlines), and a CI run kept the 2 shortest of 5 successes, both dropped, leaving nothing for 2
#: processes.
ONE_STEP_LOOP = [
    "env_config.train_tasks_rollout_size=48",
    "env_config.n_samples_per_task=2",
    "policy_config.temperature=0.5",
    "algorithm.max_steps=1",
    "algorithm.learning_rate=1e-4",
    "algorithm.per_device_train_batch_size=1",
    "algorithm.gradient_accumulation_steps=1",
    "algorithm.cutoff_len=512",
    "algorithm.selection.shortest_per_task=0",
]


def run_train_script(*args: str, waiting_for: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a script (or `-c CODE`) in the train environment from the repository root, the repo importable."""
    return run_waiting(
        [env_python("train"), *args],
        waiting_for=waiting_for,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def train_script_result(*args: str, waiting_for: str) -> dict:
    """The JSON a train-environment script prints after `RESULT `; the script must exit 0."""
    out = run_train_script(*args, waiting_for=waiting_for)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULT ", 1)[1])


def processes_mentioning(*needles: str) -> list[str]:
    """Live (non-zombie) processes whose command line contains one of the needles. `-ww`: without it ps cuts
    each line at 80 columns when it runs under pytest, and a log path further right is never seen."""
    out = subprocess.run(["ps", "-ww", "-e", "-o", "stat=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if not line.startswith("Z") and any(n in line for n in needles)]


def serves(port: int) -> bool:
    """A server answers /health on 127.0.0.1:`port` (vLLM's)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3):
            return True
    except OSError:
        return False


def policy_server(run_dir: Path, port: int, name: str = "policy") -> PolicyServer:
    """The driver's policy server for `run_dir` (its group recorded in <run_dir>/groups.json), serving `name` on
    127.0.0.1:`port` with the serve environment's interpreter, as run.sh's driver builds it."""
    return PolicyServer(Path(run_dir), port, name, Groups(Path(run_dir)), Supervisor(), env_python("serve"))


@dataclass
class VllmServer:
    base_url: str
    model: str
    model_path: Path
    port: int
    run_dir: Path
    #: the driver's object that started it (reload, sleep, wake, fingerprint, stop)
    server: PolicyServer

    def pgid(self) -> int:
        return Groups(self.run_dir).records()["vllm"].pgid


def start_vllm(run_dir: Path, model_path: Path, name: str = "policy") -> VllmServer:
    """Start vLLM on a free port through PolicyServer.start (choose, args, a recorded group, the health wait)."""
    port = free_port()
    server = policy_server(run_dir, port, name)
    try:
        server.start(str(model_path), deadline_s=600)
    except say.Ended as exc:
        log = server.log
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise RuntimeError(f"vLLM did not start (exit {exc.code}): {exc.message}\n{tail}") from exc
    return VllmServer(f"http://127.0.0.1:{port}/v1", name, model_path, port, Path(run_dir), server)


def stop_vllm(server: VllmServer) -> None:
    """PolicyServer.stop: exactly the group this run directory recorded."""
    server.server.stop()


@pytest.fixture(scope="session")
def vllm_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM for the session, serving the default model as `policy`."""
    server = start_vllm(tmp_path_factory.mktemp("vllm-session"), model_dir)
    try:
        yield server
    finally:
        stop_vllm(server)


def run_update(log: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """Run the update phase (`python -m training`) in the train environment for iteration 0."""
    cmd = [env_python("train"), "-m", "training", "--config-name", "update", f"log_path={log}", "iteration=0"]
    return run_waiting(
        [*cmd, *overrides],
        waiting_for=f"the update phase (python -m training) on {log}",
        timeout=UPDATE_S,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture(scope="session")
def train_journal(vllm_server: VllmServer, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log path holding one real train rollout (iteration 0) of the default model: the update tests train on
    copies of it (test_update.py, test_update_paths.py)."""
    from tests.e2e.rollout_cli import rollout_cmd, run_rollout

    log = tmp_path_factory.mktemp("update") / "log"
    out = run_rollout(
        rollout_cmd(
            "rollout_train",
            data_dir,
            log,
            vllm_server.base_url,
            "iteration=0",
            # RFT keeps one success per task, so the rows are the tasks solved: lora-2proc needs 4 (2 processes
            # x 2 rows) after token fidelity drops some. At temperature 1, 48 tasks once gave only 4 on CI; at
            # 0.7 an episode succeeds 1.7 times as often (ONE_STEP_LOOP), and 64 tasks at 0.7 (40 % of the 160
            # at 1 this used) trained every path in the suite run of 2026-11-30. Most solved tasks also have a
            # failure (DPO's pairs).
            "env_config.train_tasks_rollout_size=64",
            "env_config.n_samples_per_task=4",
            "policy_config.temperature=0.7",
            "policy_config.max_new_tokens=24",
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return log


@pytest.fixture
def volume(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SharedFs]:
    """The shared filesystem a multi-node test's nodes share its log path through (bench/sharedfs.py): the
    profile its `@pytest.mark.parametrize("volume", [...], indirect=True)` names, the local disk without one."""
    with shared_fs(tmp_path, getattr(request, "param", "local")) as fs:
        yield fs
