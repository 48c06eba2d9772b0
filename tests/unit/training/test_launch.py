"""The training launcher stops every process group its training made, torchrun's
workers included (they run in sessions of their own), on a signal or the time limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# A stand-in for the entry point around a stand-in for torchrun: the real signal setup and run_group; the
# launched command starts a "worker" in a session of its own (as torchrun does) and records its pid.
CHILD = """
import json, sys
from pathlib import Path
from training.launch import exit_on_signals, run_group
exit_on_signals()
tmp, timeout_s, parent_exits = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
worker = "setsid sleep 300 & echo $! > " + str(tmp / "worker.pid")
script = ("sleep 0.3; " + worker) if parent_exits else (worker + "; wait")
result = run_group(["bash", "-c", script], tmp / "train.log", {"PATH": "/usr/bin:/bin"}, timeout_s, 5)
print(json.dumps({"returncode": result.returncode, "timed_out": result.timed_out}))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(check, waiting_for: str, timeout_s: float = 30.0) -> None:
    """Poll `check` until it holds; `timeout_s` only catches a hang (each holds within a second or so)."""
    deadline = time.monotonic() + timeout_s
    while not _holds(check):
        assert time.monotonic() < deadline, f"hang: no {waiting_for} after {timeout_s:.0f} s"
        time.sleep(0.05)


def _holds(check) -> bool:
    try:
        return bool(check())
    except FileNotFoundError:  # not written yet
        return False


def _launch(tmp_path: Path, timeout_s: float = 600, parent_exits: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", CHILD, str(tmp_path), str(timeout_s), "1" if parent_exits else "0"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, worker: int) -> tuple[str, str, bool]:
    out, err = proc.communicate(timeout=30)
    survived = _alive(worker)
    if survived:  # the worker this test started, by the pid it recorded
        os.kill(worker, signal.SIGKILL)
    return out, err, survived


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, None)])
def test_a_signalled_launcher_stops_the_workers_in_their_own_sessions(
    tmp_path: Path, sig: signal.Signals, code: int | None
) -> None:
    proc = _launch(tmp_path)
    _wait_for(
        lambda: (tmp_path / "worker.pid").exists() and (tmp_path / "worker.pid").read_text().strip(), "worker pid"
    )
    worker = int((tmp_path / "worker.pid").read_text())
    # the stand-in worker runs in a session of its own (once setsid, which bash's $! names before it runs, has run)
    _wait_for(lambda: os.getpgid(worker) == worker, "process group of the worker's own")
    # the record lists the launched group and, once seen, the worker's group (for run.sh's last resort)
    _wait_for(
        lambda: str(worker) in (tmp_path / "train.log.pgid").read_text().split(), "worker group in train.log.pgid"
    )
    proc.send_signal(sig)
    _, err, survived = _finish(proc, worker)
    if code is not None:
        assert proc.returncode == code, err
    else:  # KeyboardInterrupt (even when this test runs with SIGINT ignored, as in the background)
        assert proc.returncode != 0
    assert not survived, "a worker outlived the launcher"
    assert not (tmp_path / "train.log.pgid").exists()


def test_workers_orphaned_by_their_parent_are_adopted_and_stopped_at_the_time_limit(tmp_path: Path) -> None:
    # the "torchrun" starts its worker and exits at once, between two of the launcher's looks at its
    # descendants: only as a subreaper does the launcher still find (and stop) the orphan
    proc = _launch(tmp_path, timeout_s=600, parent_exits=True)
    _wait_for(
        lambda: (tmp_path / "worker.pid").exists() and (tmp_path / "worker.pid").read_text().strip(), "worker pid"
    )
    worker = int((tmp_path / "worker.pid").read_text())
    out, err, survived = _finish(proc, worker)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"returncode": 0, "timed_out": False}
    assert not survived, "an orphaned worker outlived the launcher"


def test_the_time_limit_stops_the_workers(tmp_path: Path) -> None:
    proc = _launch(tmp_path, timeout_s=2)
    _wait_for(
        lambda: (tmp_path / "worker.pid").exists() and (tmp_path / "worker.pid").read_text().strip(), "worker pid"
    )
    worker = int((tmp_path / "worker.pid").read_text())
    out, err, survived = _finish(proc, worker)
    assert proc.returncode == 0, err
    assert json.loads(out)["timed_out"] is True
    assert not survived


def test_one_node_takes_a_free_torchrun_port_and_several_need_the_masters() -> None:
    """Two trainings on one machine never share 29500 (EADDRINUSE); several nodes must agree on node 0's port."""
    from rollout_engine.errors import ConfigError
    from training.config import LaunchConfig
    from training.launch import launch_env
    from training.recipe import Device

    cpu = Device("cpu", 1)
    ports = {int(launch_env(LaunchConfig(), cpu)["MASTER_PORT"]) for _ in range(5)}
    assert all(0 < port <= 65535 for port in ports) and 29500 not in ports
    assert launch_env(LaunchConfig(master_port=29611), cpu)["MASTER_PORT"] == "29611"
    with pytest.raises(ConfigError, match=r"launch\.master_port must be node 0.s torchrun port when launch\.nnodes=2"):
        launch_env(LaunchConfig(nnodes=2), cpu)


def test_the_trainer_gets_the_gpus_the_update_process_hid_from_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The update's own process runs with CUDA_VISIBLE_DEVICES="" (training.launch.hidden_gpus); the trainer
    gets the node's value back (unset: every GPU), and a CPU job (the LoRA merge) none."""
    from training.config import LaunchConfig
    from training.launch import launch_env
    from training.recipe import Device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES" not in launch_env(LaunchConfig(), Device("cuda", 2, None))
    assert launch_env(LaunchConfig(), Device("cuda", 2, "2,3"))["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert launch_env(LaunchConfig(), Device("cuda", 2, "2,3"))["NPROC_PER_NODE"] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert launch_env(LaunchConfig(), Device("cpu", 1))["CUDA_VISIBLE_DEVICES"] == ""


def test_a_recipe_with_baton_keys_runs_torchrun_on_baton_trainer_with_the_layout_llamafactory_cli_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fresh path: a recipe with Baton's own keys (the policy-gradient settings, the carried optimizer state)
    is trained by training.trainer_run under the torchrun `llamafactory-cli train` would start (same layout),
    any other by llamafactory-cli itself."""
    from training import launch as launch_mod
    from training.carry import CARRY
    from training.config import LaunchConfig
    from training.launch import launch_env, train_command
    from training.recipe import POLICY_GRADIENT, Device

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(launch_mod, "cli_command", lambda: ["/train-env/bin/llamafactory-cli"])  # the train env's
    launch = LaunchConfig(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29511, nproc_per_node=3)
    env = launch_env(launch, Device("cpu", 1))
    sft = tmp_path / "sft.yaml"
    sft.write_text("stage: sft\n")
    cmd = train_command(sft, dict(env))
    assert cmd == ["/train-env/bin/llamafactory-cli", "train", str(sft)]
    grpo = tmp_path / "grpo.yaml"
    grpo.write_text(f"stage: sft\n{POLICY_GRADIENT}:\n  clip_low: 0.2\n")
    cmd = train_command(grpo, env)
    assert cmd == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1", "--nproc_per_node=3",
        "--master_addr=10.0.0.1", "--master_port=29511", "-m", "training.trainer_run", str(grpo),
    ]  # fmt: skip
    carried = tmp_path / "carried.yaml"
    carried.write_text(f"stage: kto\n{CARRY}:\n  load: ''\n")
    assert train_command(carried, dict(env))[-3:] == ["-m", "training.trainer_run", str(carried)]
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere"  # the workers import training/
