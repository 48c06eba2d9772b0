"""A real `Run` (coordinator/driver/context.py) for the tests of the driver's phases.

Each run has a real Groups and Supervisor on the test's log path, a real one-node Node (inert:
no heartbeat, no protocol) and, when asked, a real PolicyServer whose serve interpreter runs
tests/shell/fake_vllm.py with vLLM's command line. The phases' commands (`python -m rollout_engine`,
`python -m training`) are fakes only where a test makes them so (`fake_python`, through
`run.pythons`); the rest is the driver's own code.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.driver.cli import Args
from coordinator.driver.context import Composed, Pythons, Run
from coordinator.driver.nodes import Node
from coordinator.driver.procs import Groups
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from tests.conftest import REPO

ROOT = str(REPO)
FAKE_VLLM = REPO / "tests" / "shell" / "fake_vllm.py"
#: SmolLM2-135M's shape: enough for the server's choice of dtype and KV cache
SHAPE = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
#: the settings the phases read; each test starts without them (BATON_DEVICE=cpu, no live view)
SETTINGS = (
    "BATON_VLLM_DTYPE",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_SIM_MULTI_NUMA",
    "CPU_VISIBLE_MEMORY_NODES",
    "CUDA_VISIBLE_DEVICES",
    "BATON_VLLM_START_S",
    "BATON_VLLM_RELOAD_S",
    "BATON_CHECK_TIMEOUT_S",
    "BATON_ROLLOUT_STALL_S",
    "BATON_ROLLOUT_TIMEOUT_S",
    "BATON_POLICY_RESTARTS",
    "BATON_RUN_ID",
    "BATON_RUN_FENCE",
)


def script(path: Path, body: str) -> str:
    """An executable bash script at `path` running `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_folder(folder: Path, weights: str = "w0", config: dict | None = None) -> Path:
    """A model folder: config.json (SHAPE unless `config`) and a model.safetensors holding `weights` (text)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SHAPE if config is None else config) + "\n")
    (folder / "model.safetensors").write_text(f"{weights}\n")
    return folder


def answers(url: str) -> bool:
    """Something answers a GET of `url` (independent of the code under test)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Poll `condition` until true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout}s for {what}")
        time.sleep(0.05)


def running(pattern: str) -> bool:
    """A process whose whole command line is `pattern` runs (pgrep -xf)."""
    return subprocess.run(["pgrep", "-xf", pattern], capture_output=True, check=False).returncode == 0


class Runs:
    """The runs of one test, on its tmp_path; whatever they still record is stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.log = tmp_path / "log"
        self.made: list[Run] = []

    def make(self, *, serve: bool = False, **args: object) -> Run:
        """A run of rank 0 of 1 on the log path (--rl-phase both unless `args` say otherwise); with `serve`, its
        PolicyServer on a free port runs fake_vllm.py (not started). The base model is <tmp>/base."""
        run_dir = self.log / "run" / "rank_0"
        fields = {"data": str(self.tmp / "data"), "log": str(self.log), "phase": "both", **args}
        a = Args(**fields)  # type: ignore[arg-type]
        port = free_port()
        serve_py = script(self.tmp / "bin" / "serve-python", f'exec {sys.executable} {FAKE_VLLM} "$@"')
        pythons = Pythons(sys.executable, serve_py, str(self.tmp / "bin" / "no-train-python"))
        composed = Composed([], [], f"http://127.0.0.1:{port}/v1", "policy", 32, [])
        groups, supervisor = Groups(run_dir), Supervisor(poll_s=0.05)
        node = Node(a, run_dir, groups, supervisor, ROOT, sys.executable, port)
        server = None
        if serve:
            server = PolicyServer(run_dir, port, "policy", groups, supervisor, serve_py, poll_s=0.05)
        base = self.tmp / "base"
        if not base.is_dir():
            model_folder(base)
        run = Run(a, ROOT, pythons, composed, groups, supervisor, node, server, str(base), port)
        run.rank_weights = list(a.weights)
        self.made.append(run)
        return run

    def fake_python(self, run: Run, which: str, body: str) -> str:
        """Make `run.pythons.<which>` a bash script running `body` (its arguments in "$@"); its path."""
        path = script(self.tmp / "bin" / f"fake-{which}-python", body)
        run.pythons = replace(run.pythons, **{which: path})
        return path

    def stop_all(self) -> None:
        for run in self.made:
            for name in sorted(run.groups.records()):
                run.groups.stop(name, 2)


def clean_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATON_DEVICE", "cpu")
    monkeypatch.setenv("BATON_PROGRESS_S", "0")
    monkeypatch.setenv("BATON_WARM_TRAINER", "0")  # the fresh path; test_trainer.py turns the warm trainer on
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
