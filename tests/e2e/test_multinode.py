"""Several run.sh "nodes" sharing one log path (docs/multinode.md), each with its own vLLM, on this machine.

- `--rl-phase both` on two nodes (one by `--master`, one by `RANK=1`): each rolls out its
  share, both train as the two nodes of one torchrun, the master promotes, both serve
  the new policy (the final held-out evaluation on both ranks carries its version),
  and metrics.jsonl holds one merged record per rollout.
- A worker node that dies (run.sh and every group it started, SIGKILLed at once) stops
  the master, which names the dead rank, instead of hanging.
- `run.sh --stop` ends every node cleanly (exit 0, nothing left running); `--resume` on
  both nodes then finishes the interrupted iteration: every planned episode once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, default_sigint
from tests.e2e.conftest import free_port, processes_mentioning
from tests.waits import UPDATE_S, VLLM_START_S, communicate_waiting, generation_s

pytestmark = pytest.mark.e2e

TWO = ["--num-nodes", "2", "--rank-weights", "1,1"]
SMALL = ["policy_config.max_new_tokens=32", "env_config.max_vllm_sessions=8", "env_config.live_view=plain"]
#: heartbeats every second, a rank silent for 10 s is dead (defaults: 5 s and 30 s)
FAST_LIVENESS = {"BATON_HEARTBEAT_S": "1", "BATON_DEAD_AFTER_S": "10"}


def node(data: Path, log: Path, rank: str | None, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """One node: run.sh in a session of its own, with its own vLLM port."""
    extra = {"BATON_VLLM_PORT": str(free_port()), "BATON_NODE_ADDR": "127.0.0.1", **FAST_LIVENESS, **(env or {})}
    flags = [] if rank is None else (["--master"] if rank == "0" else ["--worker", rank])
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log), *TWO, *flags, *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
        start_new_session=True,
    )


def episodes(log: Path, split: str, iteration: int, rank: int) -> list[dict]:
    path = log / "trajectories" / split / f"iter_{iteration:04d}" / f"rank_{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def metrics(log: Path) -> list[dict]:
    return [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines() if line.strip()]


def wait_for(condition, waiting_for: str, timeout: float, procs: list[subprocess.Popen]) -> None:
    """Poll `condition` until true; fail naming what was awaited (or which node exited first)."""
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"a node exited ({proc.returncode}) while waiting for {waiting_for}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {waiting_for}")
        time.sleep(0.5)


def kill_node(log: Path, rank: int, proc: subprocess.Popen) -> None:
    """The node dies: run.sh and every process group it recorded, SIGKILLed together."""
    groups = [int(p.read_text().split()[0]) for p in (log / "run" / f"rank_{rank}" / "pids").glob("*.pgid")]
    for pgid in [proc.pid, *groups]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=30)


def assert_nothing_left(log: Path) -> None:
    for rank in (0, 1):
        assert not list((log / "run" / f"rank_{rank}" / "pids").glob("*.pgid")), rank
    assert not processes_mentioning(str(log))


def test_two_nodes_roll_out_train_and_serve_the_promoted_policy_together(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "exp"
    args = [
        "--rl-phase",
        "both",
        "--eval-interval",
        "1",
        "--max-iterations",
        "1",
        "--final-eval",
        *SMALL,
        # 96 episodes at the base model's ~8% success: P(fewer than the 2 rows one optimizer step needs) < 1%
        "env_config.train_tasks_rollout_size=24",
        "env_config.n_samples_per_task=4",
        "env_config.test_tasks_rollout_size=8",
        "algorithm.max_steps=1",
        "algorithm.learning_rate=1e-4",
        "algorithm.per_device_train_batch_size=1",
        "algorithm.gradient_accumulation_steps=1",
        "algorithm.cutoff_len=512",
    ]
    master = node(data_dir, log, "0", *args)
    worker = node(data_dir, log, None, *args, env={"RANK": "1"})  # the seed's "export RANK=r" form
    # two vLLM starts, 96 + 8 + 8 episodes, a 2-node update and the reload of both servers
    budget = 2 * VLLM_START_S + generation_s(112, 32) + 2 * UPDATE_S
    out_w = communicate_waiting(worker, waiting_for="the worker (RANK=1) to finish the run", timeout=budget)
    out_m = communicate_waiting(master, waiting_for="the master to finish the run", timeout=300)
    assert (master.returncode, worker.returncode) == (0, 0), out_m[-3000:] + out_w[-3000:]
    train = [episodes(log, "train", 1, rank) for rank in (0, 1)]
    ids = [{t["episode_id"] for t in share} for share in train]
    assert len(ids[0]) == len(ids[1]) == 48 and not ids[0] & ids[1]  # disjoint halves of the 96
    assert (log / "training" / "iter_0001" / "train.rank_1.log").exists()  # the worker was a torchrun node
    assert os.readlink(log / "policy" / "current") == "v0001"
    for rank in (0, 1):  # the final evaluation (iteration 2): each node served the promoted policy
        final = episodes(log, "test", 2, rank)
        assert final and {t["policy_version"] for t in final} == {1}, rank
    rows = metrics(log)
    rollouts = [(r["split"], r["iteration"]) for r in rows if r["kind"] == "rollout"]
    assert sorted(rollouts) == [("test", 1), ("test", 2), ("train", 1)]  # one merged record each
    merged = next(r for r in rows if r["kind"] == "rollout" and r["split"] == "train")
    successes = sum(t["success"] for share in train for t in share)
    assert merged["ranks"] == 2 and merged["episodes"] == 96 and merged["success_rate"] == round(successes / 96, 4)
    iterations = {r["iteration"]: r for r in rows if r["kind"] == "iteration"}
    assert sorted(iterations) == [1, 2] and iterations[1]["update"] == "promoted v1"
    assert iterations[2]["eval_success_rate"] is not None
    assert_nothing_left(log)


def test_a_dead_worker_stops_the_master_which_names_it(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "exp"
    args = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--max-iterations", "1", *SMALL]
    args += ["env_config.train_tasks_rollout_size=400", "env_config.n_samples_per_task=1"]
    master, worker = node(data_dir, log, "0", *args), node(data_dir, log, "1", *args)
    wait_for(
        lambda: episodes(log, "train", 1, 1),
        "the worker's first journaled episode",
        2 * VLLM_START_S + generation_s(8, 32),
        [master, worker],
    )
    kill_node(log, 1, worker)
    out = communicate_waiting(master, waiting_for="the master to notice that rank 1 died", timeout=10 + 120)
    assert master.returncode == 1, out[-3000:]
    assert "rank 1: dead: no heartbeat change seen for" in out, out[-3000:]
    assert not list((log / "run" / "rank_0" / "pids").glob("*.pgid"))
    assert not processes_mentioning(str(log / "run" / "rank_0"))


def test_stop_ends_every_node_cleanly_and_resume_finishes_the_iteration(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "exp"
    args = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--max-iterations", "1", *SMALL]
    args += ["env_config.train_tasks_rollout_size=160", "env_config.n_samples_per_task=1"]
    nodes = [node(data_dir, log, "0", *args), node(data_dir, log, "1", *args)]
    wait_for(
        lambda: all(episodes(log, "train", 1, rank) for rank in (0, 1)),
        "a journaled episode on both nodes",
        2 * VLLM_START_S + generation_s(16, 32),
        nodes,
    )
    stop = subprocess.run(
        ["bash", str(REPO / "scripts/run.sh"), "--stop", "--log-path", str(log)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert stop.returncode == 0, stop.stderr
    outs = [communicate_waiting(proc, waiting_for="a node to stop after run.sh --stop", timeout=120) for proc in nodes]
    assert [proc.returncode for proc in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert all("stopped: " in out for out in outs), outs
    assert_nothing_left(log)
    done = [len(episodes(log, "train", 1, rank)) for rank in (0, 1)]
    assert sum(done) < 160  # stopped mid-iteration

    nodes = [node(data_dir, log, "0", *args, "--resume"), node(data_dir, log, "1", *args, "--resume")]
    budget = 2 * VLLM_START_S + generation_s(160, 32)
    waiting_for = "both nodes to finish the resumed iteration"
    outs = [communicate_waiting(proc, waiting_for=waiting_for, timeout=budget) for proc in nodes]
    assert [proc.returncode for proc in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    ids = [t["episode_id"] for rank in (0, 1) for t in episodes(log, "train", 1, rank)]
    assert len(ids) == len(set(ids)) == 160  # every planned episode once: the stopped part kept, not redone
    merged = [r for r in metrics(log) if r["kind"] == "rollout" and r["iteration"] == 1]
    assert len(merged) == 1 and merged[0]["complete"] and merged[0]["episodes"] == 160
    assert_nothing_left(log)
