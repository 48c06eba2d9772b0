"""Several run.sh "nodes" sharing one log path (docs/multinode.md), each with its own vLLM, on this machine:
each in PID, UTS and mount namespaces of its own, with its own host name and address (tests/e2e/nodes.py), and
each reaching the log path through its own client of a real shared filesystem served by the test
(bench/sharedfs.py; the profile is in each test's id): GlusterFS with its defaults, GlusterFS with NFS-like
5 s client caches, sshfs (no lock shared between clients, listings and mtimes 20 s stale); the split deployment
on the local disk.

- A node that dies (SIGKILL of its namespace's pid 1: every process of it at once) stops the
  others, which name the dead rank, instead of hanging: a worker mid-rollout, then the master.
- `--rl-phase both` on two nodes with weights 2,1, a worker's warm trainer killed in training: each node
  rolls out its share (2:1, disjoint; metrics.jsonl holds one merged record per rollout), the master stops
  its own part of the training long before the training timeout, the update fails on both nodes, and the
  next iteration's new trainers (one per node) train as the two nodes of one torchrun on the dataset the
  master prepared, and the master promotes.
- `run.sh --stop` ends every node (exit 143, nothing left running); `--resume` on both
  continues, the worker started first beside the stopped run's files waits for the new
  master; SIGTERM on the master stops the worker too, as a stop; a last `--resume`
  finishes the iteration with every planned episode exactly once.
- `--on-rank-failure continue`: a worker dead mid-rollout is evicted, the master takes over its unfinished
  episodes (each planned episode once) and trains alone; the worker, restarted late (once the master planned
  the next step without it), skips that step, the master going on without waiting for it, and joins the one
  after, its own vLLM serving the policy promoted while it was away.
- The seed's split deployment on three nodes, the rank from RANK / NODE_RANK: a rollout run and an
  update run on every node, the update run's workers started before its master, which they wait for.

Real vLLM per node (each bound to its own core) on the late rejoin; the other tests (the split deployment's
rollout runs too) use `--debug-mode` against one shared real vLLM (the session's), saving start-ups.

A node that must still be mid-rollout when the test acts has its rollout engine held with
SIGSTOP (`hold_rollouts_after_next_episode`) right after the episode the test waited for: a slow node, whatever
the speed of the machine (a fast one finishes a 160-episode share in seconds).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.nodes import host_pid, kill_node, signal_group, signal_run_sh
from bench.sharedfs import SharedFs
from coordinator import groupfile
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics
from tests.conftest import REPO
from tests.e2e.conftest import ONE_STEP_LOOP, VllmServer, processes_mentioning
from tests.e2e.nodes import kill_the_nodes_left, start_node
from tests.waits import UPDATE_S, VLLM_START_S, communicate_waiting, generation_s
from training.warm import READY, job_started

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def no_node_outlives_its_test():
    """A test that fails midway leaves no node running (each killed with all of its processes)."""
    yield
    kill_the_nodes_left()


TWO = ["--num-nodes", "2", "--rank-weights", "1,1"]
TWO_ONE = ["--num-nodes", "2", "--rank-weights", "2,1"]
THREE = ["--num-nodes", "3", "--rank-weights", "1,1,1"]
SMALL = ["policy_config.max_new_tokens=32", "env_config.max_vllm_sessions=8", "env_config.live_view=plain"]


def node(
    data: Path,
    log: Path,
    rank: str | None,
    *args: str,
    env: dict[str, str] | None = None,
    nodes: list[str] = TWO,
    host: str | None = None,
    fs: SharedFs | None = None,
) -> subprocess.Popen:
    """One node (tests/e2e/nodes.py): run.sh in namespaces of its own, with its own address and vLLM port, and
    with `fs` its own client of the shared filesystem; rank None: the rank comes from the environment (`env`), as
    the seed's `export RANK=r`."""
    flags = [] if rank is None else (["--master"] if rank == "0" else ["--worker", rank])
    number = int(rank if rank is not None else {**(env or {})}.get("RANK", (env or {}).get("NODE_RANK", "")))
    argv = ["--data-path", str(data), "--log-path", str(log), *nodes, *flags, *args]
    return start_node(number, argv, env, host, fs=fs)


def shared(server: VllmServer) -> list[str]:
    """`--debug-mode` against one real vLLM that every node uses (a fault test's start-ups saved)."""
    return ["--debug-mode", f"policy_config.base_url={server.base_url}", f"policy_config.model={server.model}"]


def episodes(log: Path, split: str, iteration: int, rank: int) -> list[dict]:
    path = Layout(log).journal(split, iteration, rank)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def metrics(log: Path) -> list[dict]:
    return [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines() if line.strip()]


def wait_for(condition, waiting_for: str, timeout: float, procs: list[subprocess.Popen], every: float = 0.5) -> None:
    """Poll `condition` every `every` s until true; fail naming what was awaited (or which node exited first)."""
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"a node exited ({proc.returncode}) while waiting for {waiting_for}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {waiting_for}")
        time.sleep(every)


def engine_group(seen: Path, rank: int) -> int | None:
    """The train rollout engine's group from rank's record; None when there is none (its engine is not started,
    or it has finished and its record is gone)."""
    record = groupfile.read(Layout(seen).groups(rank)).get("rollout-train")
    return None if record is None else record.pgid


def hold_rollouts_after_next_episode(volume: SharedFs, nodes: dict[int, subprocess.Popen], timeout: float) -> None:
    """Wait for each node's next journaled episode and SIGSTOP its rollout engine at once: the node stays
    alive (heartbeat, run.sh) and mid-rollout, a slow node, until its run.sh stops the group (SIGTERM + SIGCONT).
    The test looks in the server's store (the log path `exp` there), not through its own client: a caching
    client (gluster-5s) shows a journal's growth up to 5 s late, and a fast machine finishes a 48-episode
    share in 6 s, its engine's record gone with it."""
    seen = volume.store / "exp"
    before = {rank: len(episodes(seen, "train", 1, rank)) for rank in nodes}
    held: set[int] = set()

    def hold_the_ready() -> bool:
        for rank in set(nodes) - held:
            if len(episodes(seen, "train", 1, rank)) > before[rank] and (pgid := engine_group(seen, rank)):
                signal_group(nodes[rank], pgid, signal.SIGSTOP)
                held.add(rank)
        return held == set(nodes)

    wait_for(
        hold_the_ready, f"the next journaled episode of ranks {sorted(nodes)}", timeout, list(nodes.values()), 0.02
    )


def assert_nothing_left(log: Path, ranks: int = 2) -> None:
    for rank in range(ranks):
        assert groupfile.read(Layout(log).groups(rank)) == {}, rank
    assert not processes_mentioning(str(log))


@pytest.mark.parametrize("volume", ["gluster"], indirect=True)
def test_a_dead_node_stops_the_others_which_name_it(
    data_dir: Path, tmp_path: Path, vllm_server: VllmServer, volume: SharedFs
) -> None:
    log = volume.path / "exp"
    args = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--max-iterations", "1", *SMALL]
    args += ["env_config.train_tasks_rollout_size=96", "env_config.n_samples_per_task=1", *shared(vllm_server)]
    started = generation_s(8, 32)
    # 1. the worker dies mid-rollout (right after an episode: most of its share is left)
    nodes = {0: node(data_dir, log, "0", *args, fs=volume), 1: node(data_dir, log, "1", *args, fs=volume)}
    more = lambda: len(episodes(volume.store / "exp", "train", 1, 1)) > 0  # noqa: E731 (the server's, uncached)
    wait_for(more, "rank 1's first journaled episode", started, list(nodes.values()), every=0.02)
    kill_node(nodes[1])
    assert_survivor_names_the_dead(log, nodes[0], survivor=0, dead=1)
    # 2. --resume, then the master dies while the worker is still mid-rollout (held: its share is not done)
    nodes = {
        0: node(data_dir, log, "0", *args, "--resume", fs=volume),
        1: node(data_dir, log, "1", *args, "--resume", fs=volume),
    }
    hold_rollouts_after_next_episode(volume, {1: nodes[1]}, started)
    kill_node(nodes[0])
    assert_survivor_names_the_dead(log, nodes[1], survivor=1, dead=0)


def assert_survivor_names_the_dead(log: Path, survivor_proc: subprocess.Popen, survivor: int, dead: int) -> None:
    waiting_for = f"rank {survivor} to notice that rank {dead} died"
    out = communicate_waiting(survivor_proc, waiting_for=waiting_for, timeout=10 + 120)
    assert survivor_proc.returncode == 1, out[-3000:]
    assert f"rank {dead}: dead: no heartbeat change seen for" in out, out[-3000:]
    assert groupfile.read(Layout(log).groups(survivor)) == {}
    assert not processes_mentioning(str(log / "run" / f"rank_{survivor}"))


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("volume", ["gluster"], indirect=True)
def test_a_workers_trainer_killed_in_training_fails_the_update_on_both_nodes_and_new_trainers_take_the_next(
    data_dir: Path, tmp_path: Path, vllm_server: VllmServer, volume: SharedFs
) -> None:
    """Rank 1's warm trainer SIGKILLed as its part of iteration 1's training begins: the master stops its own part
    long before the training timeout (launch.timeout_s, 3600 s) instead of waiting for it in a collective; the
    update fails on both nodes (nothing promoted, the served policy stays) and the run goes on; iteration 2's
    update starts a new trainer on each node, which train together (torchrun across the nodes, on the dataset
    the master prepared) with the policy-gradient loss (algorithm=grpo), and the master's promotes v1; each
    node's rollout is its 2:1 share."""
    log = volume.path / "exp"
    grpo = [arg for arg in ONE_STEP_LOOP if ".selection.shortest_per_task=" not in arg] + ["algorithm=grpo"]
    args = ["--rl-phase", "both", "--eval-interval", "1", "--max-iterations", "2", *SMALL, *grpo]
    args += ["env_config.test_tasks_rollout_size=4", *shared(vllm_server)]
    nodes = {
        0: node(data_dir, log, "0", *args, nodes=TWO_ONE, fs=volume),
        1: node(data_dir, log, "1", *args, nodes=TWO_ONE, fs=volume),
    }
    trainers = [log / "run" / f"rank_{rank}" / "trainer" for rank in (0, 1)]

    def training() -> bool:  # rank 1's worker began the training job (it composed it, and said it started)
        argv = job_started(trainers[1])
        return argv is not None and "phase=train" in argv

    waiting = "rank 1's warm trainer to begin its part of iteration 1's training"
    wait_for(training, waiting, generation_s(104, 32) + UPDATE_S, list(nodes.values()), 0.02)
    first = [read_json(trainers[rank] / READY)["pid"] for rank in (0, 1)]
    os.kill(host_pid(nodes[1], first[1]), signal.SIGKILL)
    began = time.monotonic()
    failed = log / "run" / "state" / "iter_0001" / "update.done"
    wait_for(failed.exists, "the master to mark iteration 1's update", 10 + 120, list(nodes.values()))
    print(f"the master ended the update {time.monotonic() - began:.1f} s after rank 1's trainer died (timeout 3600 s)")
    budget = generation_s(104, 32) + 2 * UPDATE_S
    out_m = communicate_waiting(nodes[0], waiting_for="the master's second iteration", timeout=budget)
    out_w = communicate_waiting(nodes[1], waiting_for="the worker's second iteration", timeout=300)
    assert (nodes[0].returncode, nodes[1].returncode) == (0, 0), out_m[-3000:] + out_w[-3000:]
    assert failed.read_text().startswith("failed"), out_m[-3000:]
    # the master's part ends either by the partner watch or by its own collective's error, whichever comes first
    # (docs/multinode.md): both end the update within seconds
    watched, own = "rank 1's part of the training failed", "the warm trainer ended during the update"
    assert watched in out_m or own in out_m, out_m[-3000:]
    assert "the warm trainer ended during the update" in out_w and "killed by SIGKILL" in out_w, out_w[-3000:]
    assert (log / "run/state/iter_0002/update.done").read_text().strip() == "promoted v1", out_m[-3000:]
    assert os.readlink(log / "policy" / "current") == "v0001"
    # iteration 2 trained in new trainers, on both nodes
    now = [read_json(trainers[rank] / READY)["pid"] for rank in (0, 1)]
    assert now[0] != first[0] and now[1] != first[1], (first, now)
    rows = [json.loads(line) for line in (log / "metrics" / "update.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["kind"] == "training"]
    assert [(r["iteration"], r["trainer"]) for r in trained] == [(2, f"warm:{now[0]}")]
    train_log = (log / "training" / "iter_0002" / "train.log").read_text()
    assert "Running training" in train_log and "grpo: the policy-gradient loss with" in train_log, train_log[-3000:]
    assert len(trained[0]["pg"]["ratio"]) == 1 and trained[0]["train_rows"] >= 2, trained[0]  # a row a process
    assert (log / "training" / "iter_0002" / "train.rank_1.log").exists()  # the worker was a torchrun node
    for rank in (0, 1):  # gloo on the interface that holds the node's address (127.0.0.2, 127.0.0.3: lo)
        trainer_log = (log / "run" / f"rank_{rank}" / "logs" / "trainer.log").read_text()
        assert f"collectives: gloo on lo, NCCL on lo (lo holds 127.0.0.{rank + 2})" in trainer_log, rank
        update_log = (log / "run" / f"rank_{rank}" / "logs" / "iter_0002.update.log").read_text()
        sha = (log / "training" / "iter_0002" / "dataset.sha256").read_text().strip()
        assert f"the dataset is the one the master prepared (sha256 {sha})" in update_log, rank
    # the shared-filesystem check at the start (BATON_FS_CHECK_S, 10 s): the worker answered, GlusterFS shares locks
    check = re.search(r"\[baton\] shared filesystem \((\d+\.\d) s check\): ranks 1 see rank 0's writes: (.*)", out_m)
    said = [line for line in out_m.splitlines() if "shared filesystem" in line] or [out_m[:3000]]
    assert check and float(check.group(1)) <= 10 and "locks shared: yes" in check.group(2), said
    for iteration in (1, 2):  # disjoint 2:1 shares of the 96, one merged record of them
        train = [episodes(log, "train", iteration, rank) for rank in (0, 1)]
        ids = [{t["episode_id"] for t in share} for share in train]
        assert (len(ids[0]), len(ids[1])) == (64, 32) and not ids[0] & ids[1], iteration
        merged = [r for r in metrics(log) if r["kind"] == "rollout" and r["split"] == "train"]
        successes = sum(t["success"] for share in train for t in share)
        assert merged[iteration - 1]["ranks"] == 2 and merged[iteration - 1]["episodes"] == 96
        assert merged[iteration - 1]["success_rate"] == round(successes / 96, 4)
    # the update's records, merged by the master from the update's own file: each once
    assert [(r["kind"], r["iteration"]) for r in metrics(log) if r["kind"] in ("training", "promotion")] == [
        ("training", 2),
        ("promotion", 2),
    ]
    assert_nothing_left(log)


# long (BATON_TEST_LONG=1): 7.6 minutes on a 2-core AVX2 machine, three vLLM starts and sshfs's 20 s staleness; CI
# keeps the dead node (abort mode) and the continue mode's eviction and takeover in tests/unit/coordinator
@pytest.mark.long
@pytest.mark.parametrize("volume", ["sshfs"], indirect=True)
def test_continue_a_dead_worker_is_left_out_its_episodes_taken_over_and_restarted_late_it_joins_the_next_step(
    data_dir: Path, volume: SharedFs
) -> None:
    """--on-rank-failure continue: rank 1 dies mid-rollout of iteration 1; the master evicts it, rolls out its
    unfinished episodes itself (each planned episode once), trains alone and promotes. Issue 24, bug 1: rank 1
    is started again only once the master has planned step 2 without it; the master does not wait for it in
    step 2 (it rolls out, trains and promotes alone), and rank 1 is a member again from step 3, the final
    held-out evaluation, with its share of the tasks. (A worker restarted at once, while the master still takes
    over its episodes, runs the same skip of a step planned without it; its registration again after the
    eviction and the barriers that drop it: tests/unit/coordinator/test_cluster.py, test_barrier.py.)"""
    log = volume.path / "exp"
    args = ["--rl-phase", "both", "--eval-interval", "1", "--max-iterations", "2", "--final-eval"]
    args += ["--on-rank-failure", "continue", *SMALL, *ONE_STEP_LOOP, "env_config.test_tasks_rollout_size=8"]
    nodes = {0: node(data_dir, log, "0", *args, fs=volume), 1: node(data_dir, log, "1", *args, fs=volume)}
    hold_rollouts_after_next_episode(volume, {1: nodes[1]}, 2 * VLLM_START_S + generation_s(16, 32))
    kill_node(nodes[1])
    # what rank 1 journaled before it died (its whole namespace SIGKILLed: nothing writes after), complete
    # lines only, as the master's cut counts them; at least the episode it was held after
    text = (log / "trajectories" / "train" / "iter_0001" / "rank_1.jsonl").read_text()
    journaled = [json.loads(line)["episode_id"] for line in text[: text.rfind("\n") + 1].splitlines()]
    assert journaled

    def plan_2() -> bool:  # the master's plan of step 2 (made without rank 1: evicted, not yet restarted)
        return any((log / "cluster" / "runs").glob("*/barriers/iter_0002/plan/rank_0.json"))

    wait_for(plan_2, "the master's plan of step 2", generation_s(112, 32) + UPDATE_S, [nodes[0]])
    # restarted as a fresh machine (in a PID namespace of its own, its run.sh would get the dead one's pid)
    restarted = node(data_dir, log, "1", *args, host="node1b", fs=volume)
    budget = VLLM_START_S + generation_s(208, 32) + 2 * UPDATE_S
    out_m = communicate_waiting(nodes[0], waiting_for="the master's 2 iterations and final evaluation", timeout=budget)
    out_w = communicate_waiting(restarted, waiting_for="the restarted rank 1's final evaluation", timeout=300)
    assert (nodes[0].returncode, restarted.returncode) == (0, 0), out_m[-3000:] + out_w[-3000:]
    # step 1: rank 1 evicted, its unfinished episodes taken over, the master trained alone
    going_on = "train_rollout of iteration 1: going on without ranks [1] (rank 1 evicted: dead: no heartbeat change"
    assert going_on in out_m, out_m[-3000:]
    first = json.loads((log / "trajectories" / "train" / "iter_0001" / "manifest.json").read_text())
    assert first["complete"] and first["missing_ranks"] == [1] and first["episodes"] == first["planned"] == 96
    assert first["reassigned"] and not first["duplicates"] and not first["missing"]
    taken = episodes_in(log / "trajectories" / "train" / "iter_0001", "rank_0.takeover_1.jsonl")
    # rank 1's share of 48: exactly what it journaled stays its own, the master took over the rest
    cut = first["cut"]["1"]
    assert (cut["lines"], cut["episodes"], cut["verified"]) == (len(journaled), len(journaled), True)
    assert len(taken) == 48 - len(journaled) and not {t["episode_id"] for t in taken} & set(journaled)
    assert not (log / "training" / "iter_0001" / "train.rank_1.log").exists()  # iteration 1 trained on the master
    # step 2: planned without rank 1, the master did not wait for it
    assert "of iteration 2: waiting for ranks 1" not in out_m, out_m[-3000:]
    assert "step 2 was planned without this node" in out_w and "step 3 was planned without this node" not in out_w
    second = json.loads((log / "trajectories" / "train" / "iter_0002" / "manifest.json").read_text())
    # every planned episode of step 2 exactly once, all the master's (the step was planned without rank 1)
    assert second["complete"] and second["episodes"] == second["planned"] == 96 and list(second["ranks"]) == ["0"]
    assert not episodes(log, "train", 2, 1)
    assert not (log / "training" / "iter_0002" / "train.rank_1.log").exists()
    assert os.readlink(log / "policy" / "current") == "v0002"
    # step 3: the restarted rank rolled out its share of the final evaluation, its own vLLM serving v2, the
    # policy promoted while it was away
    final = [episodes(log, "test", 3, rank) for rank in (0, 1)]
    ids = [{t["episode_id"] for t in share} for share in final]
    assert len(ids[1]) == len(ids[0]) > 0 and not ids[0] & ids[1]
    assert [{t["policy_version"] for t in share} for share in final] == [{2}, {2}]
    assert_nothing_left(log)


def episodes_in(directory: Path, name: str) -> list[dict]:
    path = directory / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_id(log: Path) -> str:
    return json.loads((log / "roles" / "rollout" / "cluster" / "run.json").read_text())["run_id"]


@pytest.mark.parametrize("volume", ["gluster-5s"], indirect=True)
def test_stop_and_sigterm_on_the_master_stop_every_node_and_resume_finishes_the_iteration(
    data_dir: Path, tmp_path: Path, vllm_server: VllmServer, volume: SharedFs
) -> None:
    log = volume.path / "exp"
    args = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--max-iterations", "1", *SMALL]
    args += ["env_config.train_tasks_rollout_size=96", "env_config.n_samples_per_task=1", *shared(vllm_server)]
    both_started = generation_s(16, 32)

    # 1. run.sh --stop: every node stops (143), nothing left (both held mid-rollout after an episode)
    nodes = [node(data_dir, log, "0", *args, fs=volume), node(data_dir, log, "1", *args, fs=volume)]
    hold_rollouts_after_next_episode(volume, dict(enumerate(nodes)), both_started)
    first_run = run_id(log)
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
    assert [proc.returncode for proc in nodes] == [143, 143], outs[0][-2000:] + outs[1][-2000:]
    assert all("stopped: " in out and "run.sh --stop" in out for out in outs), outs
    assert_nothing_left(log)

    # 2. --resume, the worker first: beside the stopped run's files it waits for a live master,
    #    then joins the new run; SIGTERM on the master stops the worker too, as a stop
    worker = node(data_dir, log, "1", *args, "--resume", fs=volume)
    wait_for(lambda: (log / "run" / "rank_1" / "owner.rollout").exists(), "the worker to start", 60, [worker])
    master = node(data_dir, log, "0", *args, "--resume", fs=volume)
    # (the worker held mid-rollout, so the iteration is not done when the master stops)
    hold_rollouts_after_next_episode(volume, {1: worker}, both_started)
    assert run_id(log) != first_run
    signal_run_sh(master, signal.SIGTERM)
    out_m = communicate_waiting(master, waiting_for="the master to stop on SIGTERM", timeout=120)
    out_w = communicate_waiting(worker, waiting_for="the worker to stop after the master's SIGTERM", timeout=120)
    assert (master.returncode, worker.returncode) == (143, 143), out_m[-2000:] + out_w[-2000:]
    assert "stopped: " in out_w and "SIGTERM on the master" in out_w, out_w[-2000:]
    assert_nothing_left(log)

    # 3. --resume finishes the iteration: every planned episode once, the stopped parts kept; the starts spread
    #    over 8 s (as from 64 nodes on over 60 s): the worker starts 4 s after the master
    spread = {"BATON_START_SPREAD_S": "8"}
    nodes = [
        node(data_dir, log, "0", *args, "--resume", env=spread, fs=volume),
        node(data_dir, log, "1", *args, "--resume", env=spread, fs=volume),
    ]
    budget = generation_s(96, 32)
    waiting_for = "both nodes to finish the resumed iteration"
    outs = [communicate_waiting(proc, waiting_for=waiting_for, timeout=budget) for proc in nodes]
    assert [proc.returncode for proc in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert "starting in" not in outs[0] and "[baton] rank 1 of 2: starting in 4.0s" in outs[1], outs[1][:2000]
    ids = [t["episode_id"] for rank in (0, 1) for t in episodes(log, "train", 1, rank)]
    merged = [r for r in metrics(log) if r["kind"] == "rollout" and r["iteration"] == 1]
    assert len(merged) == 1 and merged[0]["complete"]
    assert len(ids) == len(set(ids)) == merged[0]["episodes"] == merged[0]["planned"] == 96  # every one, once
    assert_nothing_left(log)


@pytest.mark.parametrize("volume", ["local"], indirect=True)
def test_split_deployment_on_three_nodes_with_the_rank_from_the_environment(
    data_dir: Path, tmp_path: Path, vllm_server: VllmServer, volume: SharedFs
) -> None:
    """The seed's split deployment on three nodes, each told its rank only by the environment (`export RANK=r`
    for the rollout runs, NODE_RANK for the update runs): the update run trains (on the three nodes) what the
    rollout run (on the three) collected, each run coordinating in its own group; the update run's workers
    start before its master and wait for it. The rollout runs use the
    seed's `--debug-mode` with a vLLM already running (one real server for the three, on this machine)."""
    log = volume.path / "exp"
    rollout = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--max-iterations", "1", *SMALL]
    # 96 tasks once each at temperature 0.5, about 11 successes expected (docs/benchmarks.md 3h): at 1 a suite
    # run's 96 episodes solved 2, fewer than 3 rows
    rollout += ["env_config.train_tasks_rollout_size=96", "env_config.n_samples_per_task=1", *shared(vllm_server)]
    rollout += ["policy_config.temperature=0.5"]
    update = ["--rl-phase", "update", "--max-iterations", "1", "algorithm.max_steps=1", "algorithm.learning_rate=1e-4"]
    update += ["algorithm.per_device_train_batch_size=1", "algorithm.gradient_accumulation_steps=1"]
    # every success (not only the shortest per task): 3 processes need at least 3 rows from 96 episodes
    update += ["algorithm.cutoff_len=512", "algorithm.selection.shortest_per_task=0"]
    poll = {"BATON_UPDATE_POLL_S": "2"}
    ranks = ("0", "1", "2")

    def update_node(rank: str) -> subprocess.Popen:
        return node(
            data_dir, log, None, *update, env={"NODE_RANK": rank, **poll}, nodes=THREE, host=f"update{rank}", fs=volume
        )

    # The update run's workers start before its master (while the rollout runs collect): they wait for it.
    nodes = [update_node(r) for r in ranks[1:]]
    nodes += [
        node(data_dir, log, None, *rollout, env={"RANK": r}, nodes=THREE, host=f"rollout{r}", fs=volume) for r in ranks
    ]
    started = lambda: all(Layout(log).owner(int(r), "update").exists() for r in ranks[1:])  # noqa: E731
    wait_for(started, "the update run's workers to claim their ranks, before its master starts", 120, nodes[:2])
    nodes.insert(0, update_node("0"))
    budget = generation_s(96, 32) + 3 * UPDATE_S
    outs = [
        communicate_waiting(proc, waiting_for="the six runs of the split deployment", timeout=budget) for proc in nodes
    ]
    assert [proc.returncode for proc in nodes] == [0] * 6, "\n".join(out[-1500:] for out in outs)
    for out in outs[1:3]:  # the update workers waited for their master, then joined its run
        assert "waiting for the master (rank 0)" in out and "of 3: run " in out, out[-1500:]
    shares = [{t["episode_id"] for t in episodes(log, "train", 1, rank)} for rank in (0, 1, 2)]
    assert [len(share) for share in shares] == [32, 32, 32] and len(set().union(*shares)) == 96
    promoted = log / "policy" / "v0001" / "baton_policy.json"
    if not promoted.exists():  # every run exited 0: the update's own words say why it kept the policy
        update_logs = "\n".join(p.read_text()[-2000:] for p in sorted(log.glob("**/iter_0001.update.log")))
        pytest.fail(f"the update run promoted no policy:\n{outs[0][-3000:]}\n{update_logs}")
    assert json.loads(promoted.read_text())["iteration"] == 1
    assert all((log / "training" / "iter_0001" / f"train.rank_{rank}.log").exists() for rank in (1, 2))
    assert (log / "roles" / "rollout" / "cluster" / "run.json").exists()
    assert (log / "roles" / "update" / "cluster" / "run.json").exists() and not (log / "cluster").exists()
    # the update run (its own host) appended no line to metrics.jsonl, the rollout run's master's file: its records
    # are in its own file, numbered (the master merges them by number), and readers see each once
    assert all("update_seq" in r for r in metrics(log) if r["kind"] in ("training", "promotion"))
    assert [(r["kind"], r["update_seq"]) for r in load_metrics(log) if "update_seq" in r] == [
        ("training", 1),
        ("promotion", 2),
    ]
    assert_nothing_left(log, ranks=3)
