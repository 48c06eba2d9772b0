"""coordinator/driver/run.py and phase.py around a run of one node: the process groups a run stops (the
dashboard's among them, with --dashboard-port), the dashboard served until its group is stopped, the
signals (an eviction's SIGUSR1 during a wait), a single node's inert Node, and the master's markers,
which a superseded run no longer writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import runstate
from coordinator.driver import run as driver_run
from coordinator.driver import say
from coordinator.driver.cli import Args
from coordinator.driver.context import Composed
from coordinator.driver.nodes import Node
from coordinator.driver.phase import mark
from coordinator.driver.procs import Groups, group_alive
from coordinator.membership import start_run
from rollout_engine.layout import GROUPS_NAME
from tests.unit.coordinator.fakes import old_run
from tests.unit.driver.fakes import ROOT, Runs, answers, free_port, wait_for

# --- the groups of a run, and its dashboard -------------------------------------------------------------------


def test_the_dashboard_is_a_group_of_the_run_only_with_dashboard_port_named_per_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("BATON_APP_PY", "BATON_SERVE_PY", "BATON_TRAIN_PY"):
        monkeypatch.setenv(name, "python")
    composed = Composed([], [], "http://127.0.0.1:8999/v1", "policy", 32, [])
    monkeypatch.setattr(driver_run, "compose", lambda *_a: composed)

    def built(phase: str, port: int | None) -> tuple[list[str], str]:
        run = driver_run.build(Args(data=str(tmp_path), log=str(tmp_path / "log"), phase=phase, dashboard_port=port))
        return run.group_names, run.dashboard_name

    names, dashboard = built("both", None)
    assert dashboard == "" and not [n for n in names if n.startswith("dashboard")]
    assert built("both", 8080) == ([*names, "dashboard"], "dashboard")
    names, dashboard = built("update", 8080)
    assert dashboard == "dashboard-update" and names[-1] == "dashboard-update" and "watch-update" in names


def test_the_dashboard_serves_the_page_until_its_group_is_stopped(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    run = runs.make(phase="rollout", split="train-only", dashboard_port=port)
    run.dashboard_name = "dashboard"
    Path(run.log).mkdir(parents=True)
    driver_run.dashboard_start(run)
    assert f"[baton] dashboard: http://127.0.0.1:{port}/ (log: " in capsys.readouterr().err
    record = run.groups.recorded("dashboard")
    assert record is not None
    logfile = run.run_dir / "logs" / "dashboard.log"
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/api/state"), "the dashboard's answer")
    except BaseException:
        print(logfile.read_text() if logfile.exists() else "(no log)")
        raise
    run.groups.stop("dashboard", 5)
    assert not group_alive(record[0])
    assert run.groups.recorded("dashboard") is None
    assert "dashboard: stopped" in logfile.read_text()


# --- signals and waits -----------------------------------------------------------------------------------------


@pytest.fixture
def handlers() -> Iterator[None]:
    """install_signals replaces the handlers of SIGINT, SIGTERM and SIGUSR1: the test's are put back afterwards."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_an_eviction_s_sigusr1_during_a_wait_is_waited_through_and_stops_a_training_it_concerns(
    runs: Runs, handlers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.make()
    driver_run.install_signals(run)
    me = os.getpid()
    phase = run.groups.start("rollout-train", ["sh", "-c", "sleep 1.5; exit 7"], None)
    threading.Timer(0.3, os.kill, (me, signal.SIGUSR1)).start()
    assert run.supervisor.wait(phase) == 7  # no update runs: the signal changes nothing
    assert "evicted" not in capsys.readouterr().err
    run.groups.forget("rollout-train")
    update = run.groups.start("update", ["sh", "-c", "sleep 30; exit 7"], None)
    run.update_running = 3
    threading.Timer(0.3, os.kill, (me, signal.SIGUSR1)).start()
    assert run.supervisor.wait(update) == 128 + signal.SIGTERM  # stopped, not waited for
    assert "a rank of this training was evicted; stopping the update of iteration 3" in capsys.readouterr().err
    assert not group_alive(update.pgid) and run.groups.recorded("update") is None


def test_a_single_node_has_no_heartbeat_and_its_waits_are_plain_waits(runs: Runs) -> None:
    run = runs.make()
    run.node.start(1)
    assert run.node.run_id == "" and not (run.run_dir / GROUPS_NAME).exists()
    assert run.supervisor.wait(subprocess.Popen(["sh", "-c", "exit 5"])) == 5  # type: ignore[arg-type]
    assert run.node.leave(5, iteration=1, phase="update", last_error="x") == 5
    assert not (Path(run.log) / "cluster").exists()


#: a run of rank 0 on <argv[1]>/log, through run.execute as run.sh's driver runs it (its exit code is the script's)
EXECUTE = """
import sys
from pathlib import Path
from coordinator.driver import run as driver_run
from tests.unit.driver.fakes import Runs
run = Runs(Path(sys.argv[1])).make(phase="rollout", split="train-only")
run.roles, run.group_names = ["rollout"], ["rollout-train"]  # what build() gives a rollout run, in part
resolved = Path(sys.argv[1]) / "resolved.yaml"
resolved.write_text("{}")
sys.exit(driver_run.execute(run, resolved))
"""


def test_a_sigterm_while_the_claim_stops_an_earlier_run_s_group_still_cleans_up(runs: Runs) -> None:
    """A resume first stops what a dead run left (up to 10 s a group): a SIGTERM then (Slurm's, a user's) ends the
    run through its clean-up, which stops that group and gives up the claims, instead of killing the driver with
    the group left running."""
    run = runs.make(phase="rollout", split="train-only")
    stale = run.groups.start("rollout-train", ["bash", "-c", "trap '' TERM; while :; do sleep 0.1; done"], None)
    run.groups = Groups(run.run_dir)  # forgets that this process started it: an earlier run's record
    driver = subprocess.Popen(
        [sys.executable, "-c", EXECUTE, str(runs.tmp)], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    assert driver.stderr is not None
    said = []
    for line in driver.stderr:
        said.append(line)
        if "was left running by an earlier run; stopping it" in line:
            driver.send_signal(signal.SIGTERM)
            break
    said += driver.stderr.readlines()
    assert driver.wait(timeout=30) == 128 + signal.SIGTERM, "".join(said)
    assert "Traceback" not in "".join(said)
    assert not group_alive(stale.pgid), "the earlier run's group was left running"
    assert not list(run.run_dir.glob("owner.*")), "the claims were not given up"
    stale.popen.wait(timeout=5)


# --- markers ---------------------------------------------------------------------------------------------------


def test_a_master_of_a_superseded_run_writes_no_marker_of_run_state_and_stops_with_143(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.make()
    log = Path(run.log)
    mark(run, 2, "train_rollout")  # a single node has no run to be superseded in: it marks
    assert runstate.is_done(log, 2, "train_rollout")
    two = Args(log=str(log), phase="both", num_nodes=2, rank_weights="1,1")
    run.node = Node(two, run.run_dir, run.groups, run.supervisor, ROOT, run.pythons.app, run.port)
    run.node.run_id = start_run(log, 2, [1, 1], heartbeat_interval_s=0.5, dead_after_s=10).run_id
    mark(run, 3, "train_rollout")  # still the log path's run
    assert runstate.is_done(log, 3, "train_rollout")
    newer = old_run(log)
    with pytest.raises(say.Ended) as caught:
        mark(run, 4, "train_rollout")
    assert type(caught.value) is say.Ended and caught.value.code == 143
    assert caught.value.message == "the run was asked to stop (marking train_rollout of iteration 4); this node stops"
    assert f"superseded by run {newer.run_id}" in capsys.readouterr().err
    assert not runstate.is_done(log, 4, "train_rollout")


# --- compose: vllm_config resolved for this node ----------------------------------------------------------------


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A data path with a model folder (SmolLM2's shape, an 8192-token context) and a train task file."""
    import json

    from tests.unit.driver.fakes import SHAPE

    data = tmp_path / "data"
    model = data / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({**SHAPE, "max_position_embeddings": 8192}))
    (data / "tasks").mkdir()
    task = {"task_id": "t1", "task_name": "1 + 1 =", "metadata": {"dataset": "chain_sum", "entry": {"question": "?"}}}
    (data / "tasks" / "train.jsonl").write_text(json.dumps(task) + "\n")
    return data, model


def test_compose_resolves_vllm_config_for_this_node_the_node_file_over_the_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resolved context is `composed.vllm.max_model_len` (a plain int); the node file's group wins over the
    command line on its ranks, and the resolved config saved under the log path says what this node runs."""
    import yaml

    monkeypatch.setenv("BATON_DEVICE", "cpu")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # a core list per worker: 2 workers on 1 NUMA node
    data, model = _inputs(tmp_path)
    overrides = ["vllm_config.tensor_parallel_size=4", "vllm_config.max_model_len=4096"]
    args = Args(data=str(data), log=str(tmp_path / "log"), phase="rollout", split="train-only", overrides=overrides)
    args.node_vllm = {"tensor_parallel_size": 2}

    composed = driver_run.compose(args, str(model), tmp_path / "resolved.yaml")

    assert composed.vllm is not None
    assert (composed.vllm.max_model_len, composed.vllm.tensor_parallel_size, composed.vllm.data_parallel_size) == (
        4096,
        2,
        1,
    )
    assert composed.vllm.allowed_local_media_path == str(tmp_path / "log")
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["rollout_train"]["vllm_config"] == {
        **{"max_model_len": 4096, "tensor_parallel_size": 2, "data_parallel_size": 0},
        **{"gpu_memory_utilization": 0.85, "limit_mm_per_prompt": {}, "allowed_local_media_path": "auto"},
        "extra_args": [],
    }
    assert "[baton] vLLM: context 4096 tokens (vllm_config.max_model_len); tensor parallel 2 x data parallel 1\n" in (
        capsys.readouterr().err
    )
    args.debug = True  # an external server: nothing of ours to resolve
    assert driver_run.compose(args, str(model), None).vllm is None


def test_compose_refuses_max_new_tokens_that_leave_no_room_in_the_auto_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_DEVICE", "cpu")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    data, model = _inputs(tmp_path)
    overrides = ["policy_config.max_new_tokens=8192"]
    args = Args(data=str(data), log=str(tmp_path / "log"), phase="rollout", split="train-only", overrides=overrides)
    with pytest.raises(say.Die) as bad:
        driver_run.compose(args, str(model), None)
    assert (bad.value.code, bad.value.message) == (
        2,
        "policy_config.max_new_tokens must leave at least 256 tokens of vllm_config.max_model_len for the prompt "
        "(got 8192 of 2048, auto: the model's 8192 tokens, at most 2048 on a CPU); lower policy_config.max_new_tokens"
        " to <= 1792, or raise vllm_config.max_model_len to >= 8448",
    )
    assert not (tmp_path / "log").exists()
