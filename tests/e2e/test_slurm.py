"""Baton under a real Slurm (docs/slurm.md): Debian's slurm-wlm, its slurmctld, slurmd and munged started by this
module on this machine (one node, `localhost`: tests/e2e/slurm_cluster.py), jobs of scripts/slurm/baton.sbatch
as a user submits them, two tasks on the one node, each task one run.sh node with its rank from SLURM_PROCID.

- A 2-task job rolls out one iteration: each rank journals its disjoint half, the master merges them, srun and
  the job exit 0, nothing is left running.
- `scancel` of a running job: every task's run.sh stops its own processes and exits 143 long before Slurm's
  KillWait (120 s here), so nothing is left for Slurm to kill.
- The time limit's signal (`--signal=B:TERM@120`, which `scancel --batch --signal=TERM` sends now): the batch
  shell forwards the stop to the tasks (exit 143, nothing left); the job, requeued, starts again with
  --resume and finishes the iteration with every planned episode exactly once.

Both tasks run on this one host: a node file gives each its own address (127.0.0.2, 127.0.0.3), and they
use `--debug-mode` against the session's real vLLM (no vLLM start per task). The template's #SBATCH lines
are overridden on sbatch's command line as a user would for this node: 2 tasks on 1 node, no GPUs.
A rank that must still be mid-rollout when the test acts has its rollout engine held with SIGSTOP right
after its first journaled episode (as in test_multinode.py): a slow node, whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator import groupfile
from rollout_engine.layout import Layout
from tests.conftest import REPO
from tests.e2e.conftest import VllmServer, processes_mentioning
from tests.e2e.slurm_cluster import KILL_WAIT_S, SlurmCluster, start_cluster
from tests.waits import START_S, generation_s, run_waiting, wait_until

pytestmark = pytest.mark.e2e

TEMPLATE = REPO / "scripts" / "slurm" / "baton.sbatch"
#: the template's resources overridden for this one CPU node: its two tasks, no GPUs, a time limit far off
ON_THIS_NODE = ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--gpus-per-node=0", "--time=60"]
SMALL = ["policy_config.max_new_tokens=32", "env_config.max_vllm_sessions=8", "env_config.live_view=plain"]
#: heartbeats every second, a rank silent for 10 s is dead (as tests/e2e/nodes.py)
FAST_LIVENESS = {"BATON_HEARTBEAT_S": "1", "BATON_DEAD_AFTER_S": "10"}
NODE_FILE = """\
node_groups:
  - {label: task0, node_ranks: 0, node_addr: 127.0.0.2}
  - {label: task1, node_ranks: 1, node_addr: 127.0.0.3}
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


def run_args(data: Path, log: Path, server: VllmServer, *extra: str) -> list[str]:
    """run.sh's arguments for a rollout-only iteration of both tasks (no --master/--worker: Slurm's ranks)."""
    node_file = log.parent / "nodes.yaml"
    node_file.write_text(NODE_FILE)
    args = ["--data-path", str(data), "--log-path", str(log), "--rl-phase", "rollout", "--rollout-split", "train-only"]
    args += ["--max-iterations", "1", "--rank-weights", "1,1", "--node-file", str(node_file), *SMALL]
    args += ["--debug-mode", f"policy_config.base_url={server.base_url}", f"policy_config.model={server.model}"]
    return [*args, *extra]


def sbatch(slurm: SlurmCluster, out: Path, args: list[str], *, wait_s: float | None = None) -> tuple[str, int]:
    """Submit the template with `args` for run.sh (the job's log: `out`); with `wait_s`, wait for the job to
    end (sbatch --wait) and return its exit code too."""
    wait = [] if wait_s is None else ["--wait"]
    cmd = ["sbatch", "--parsable", *wait, *ON_THIS_NODE, f"--output={out}", str(TEMPLATE), *args]
    env = slurm.env(BATON_REPO=str(REPO), **FAST_LIVENESS)
    waiting_for = "sbatch to submit the job" if wait_s is None else "the job to end (sbatch --wait)"
    done = run_waiting(cmd, waiting_for=waiting_for, timeout=wait_s or START_S, env=env, cwd=REPO)
    job = done.stdout.strip().split(";")[0]
    if not job.isdigit():
        pytest.fail(f"sbatch did not submit the job (exit {done.returncode}): {done.stderr.strip()}")
    return job, done.returncode


def episodes(log: Path, rank: int) -> list[dict]:
    path = log / "trajectories" / "train" / "iter_0001" / f"rank_{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def task_exits(output: str) -> dict[int, str]:
    """srun's report of the tasks that did not exit 0 ("task 1: Exited with exit code 143",
    "tasks 0-1: Killed"), by task."""
    found: dict[int, str] = {}
    for tasks, how in re.findall(r"srun: error: \S+: tasks? ([\d,-]+): (.+)", output):
        for part in tasks.split(","):
            first, _, last = part.partition("-")
            for task in range(int(first), int(last or first) + 1):
                found[task] = how.strip()
    return found


def running_check(job: str, out: Path) -> Callable[[], None]:
    """A wait_until check: fail when the job has ended or failed to start (its batch shell said so)."""

    def check() -> None:
        text = out.read_text() if out.exists() else ""
        if "run.sh's tasks ended" in text or "[baton-sbatch] error:" in text:
            pytest.fail(f"job {job} ended before the test acted:\n{text[-3000:]}")

    return check


def hold_each_rank_after_its_first_episode(job: str, out: Path, log: Path) -> None:
    """Wait for each rank's first journaled episode and SIGSTOP its rollout engine at once: the rank stays
    mid-rollout (run.sh and its heartbeat run) until its run.sh stops the group (SIGTERM + SIGCONT)."""
    held: set[int] = set()

    def hold_the_ready() -> bool:
        for rank in {0, 1} - held:
            if episodes(log, rank):
                pgid = groupfile.read(Layout(log).groups(rank))["rollout-train"].pgid
                os.killpg(pgid, signal.SIGSTOP)
                held.add(rank)
        return held == {0, 1}

    wait_until(
        hold_the_ready,
        waiting_for=f"the first journaled episode of both ranks of job {job}",
        timeout=generation_s(16, 32),
        every=0.02,
        check=running_check(job, out),
    )


def job_held_mid_rollout(
    slurm: SlurmCluster, data: Path, log: Path, out: Path, server: VllmServer, episodes: int
) -> str:
    """Submit a 2-task rollout of `episodes` (the node count from SLURM_NTASKS) and hold each rank after
    its first episode; return the job id."""
    sizes = [f"env_config.train_tasks_rollout_size={episodes}", "env_config.n_samples_per_task=1"]
    job, _ = sbatch(slurm, out, run_args(data, log, server, *sizes))
    hold_each_rank_after_its_first_episode(job, out, log)
    return job


def assert_nothing_left(log: Path) -> None:
    for rank in (0, 1):
        assert groupfile.read(Layout(log).groups(rank)) == {}, rank
    assert not processes_mentioning(str(log))


def stop_and_time(slurm: SlurmCluster, job: str, *scancel_args: str) -> float:
    """scancel the job as given, wait for it to end, return the seconds it took (printed, never asserted: a
    task's own exit code tells its own clean-up from Slurm's SIGKILL after KillWait). The wait's bound,
    KillWait and a margin, only catches a job that does not end even then."""
    began = time.monotonic()
    slurm.run("scancel", *scancel_args, job)
    wait_until(
        lambda: slurm.state(job) is None,
        waiting_for=f"job {job} to end after scancel {' '.join(scancel_args)}",
        timeout=KILL_WAIT_S + START_S,
    )
    return time.monotonic() - began


def test_a_two_task_job_rolls_out_one_iteration_each_task_a_rank(
    data_dir: Path, tmp_path: Path, slurm: SlurmCluster, vllm_server: VllmServer
) -> None:
    log, out = tmp_path / "exp", tmp_path / "slurm.out"
    args = run_args(data_dir, log, vllm_server, "--num-nodes", "2")
    args += ["env_config.train_tasks_rollout_size=8", "env_config.n_samples_per_task=2"]
    job, rc = sbatch(slurm, out, args, wait_s=START_S + generation_s(16, 32))
    text = out.read_text()
    assert rc == 0, text[-3000:]
    for rank in (0, 1):
        assert f"{rank}: [baton] Slurm job {job} step " in text, text[-3000:]
        assert f"task {rank} of 2 on localhost; rank {rank} of 2 from SLURM_PROCID / SLURM_NTASKS" in text
    assert "1: [baton] rank 1 of 2: run " in text and ", master 127.0.0.2 " in text  # from the run record
    assert "[baton-sbatch] run.sh's tasks ended: srun exit 0" in text
    ids = [{t["episode_id"] for t in episodes(log, rank)} for rank in (0, 1)]
    assert (len(ids[0]), len(ids[1])) == (8, 8) and not ids[0] & ids[1]  # disjoint halves of the 16
    merged = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rollout = [r for r in merged if r["kind"] == "rollout"]
    assert len(rollout) == 1 and rollout[0]["ranks"] == 2 and rollout[0]["episodes"] == 16
    assert slurm.job(job)["ExitCode"] == "0:0"
    assert_nothing_left(log)


def test_scancel_stops_every_task_by_its_own_clean_up_before_killwait(
    data_dir: Path, tmp_path: Path, slurm: SlurmCluster, vllm_server: VllmServer
) -> None:
    log, out = tmp_path / "exp", tmp_path / "slurm.out"
    job = job_held_mid_rollout(slurm, data_dir, log, out, vllm_server, episodes=96)
    took = stop_and_time(slurm, job)
    print(f"job {job} ended {took:.1f} s after scancel (KillWait {KILL_WAIT_S} s)")
    text = out.read_text()
    # each task's exit is its own: a task still running at KillWait would be SIGKILLed ("Killed"), and
    # KillWait is long (KILL_WAIT_S) so that the two cannot be confused (docs/slurm.md)
    assert task_exits(text) == {0: "Exited with exit code 143", 1: "Exited with exit code 143"}, text[-3000:]
    assert "every node of the run stops; continue it with --resume" in text, text[-3000:]
    assert slurm.job(job)["JobState"] == "CANCELLED"
    assert_nothing_left(log)


def test_the_time_limit_signal_stops_the_run_resumably_and_the_requeued_job_finishes_it(
    data_dir: Path, tmp_path: Path, slurm: SlurmCluster, vllm_server: VllmServer
) -> None:
    log, out = tmp_path / "exp", tmp_path / "slurm.out"
    job = job_held_mid_rollout(slurm, data_dir, log, out, vllm_server, episodes=48)
    # 1. what --signal=B:TERM@120 does two minutes before the time limit: SIGTERM to the batch shell alone
    took = stop_and_time(slurm, job, "--batch", "--signal=TERM")
    print(f"job {job} ended {took:.1f} s after the time limit's SIGTERM (KillWait {KILL_WAIT_S} s)")
    text = out.read_text()
    assert "[baton-sbatch] SIGTERM (the time limit is near): stopping every node at a resumable point" in text
    # each task's own exit 143 (not "Killed" at KillWait): run.sh's clean-up ended it
    assert task_exits(text) == {0: "Exited with exit code 143", 1: "Exited with exit code 143"}, text[-3000:]
    assert "run.sh's tasks ended: srun exit 143" in text, text[-3000:]
    assert slurm.job(job)["ExitCode"] == "143:0"
    assert_nothing_left(log)
    kept = sum(len(episodes(log, rank)) for rank in (0, 1))
    assert 2 <= kept < 48
    # 2. requeued (soon: a requeued job waits a while by default), it continues with --resume. Not in the
    # second its first run ended: slurmd revokes the job's credentials at that second, and a launch whose
    # credential bears the same second is killed ("Job credential revoked", the job FAILED, seen once here).
    slurm.run("scontrol", "requeue", job)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+3")
    wait_until(
        lambda: slurm.job(job)["JobState"] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"),
        waiting_for=f"the requeued job {job} to finish the iteration",
        timeout=START_S + generation_s(48, 32),
        every=2,
    )
    text = out.read_text()  # --open-mode=append: both runs' lines
    info = slurm.job(job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), text[-3000:]
    assert "[baton-sbatch] restart 1 of a requeued job: adding --resume" in text
    ids = [t["episode_id"] for rank in (0, 1) for t in episodes(log, rank)]
    assert len(ids) == len(set(ids)) == 48  # every planned episode once: the stopped parts kept, none twice
    merged = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rollout = [r for r in merged if r["kind"] == "rollout" and r["iteration"] == 1]
    assert len(rollout) == 1 and rollout[0]["complete"] and rollout[0]["episodes"] == rollout[0]["planned"] == 48
    assert_nothing_left(log)
