"""The protocol's subcommands people run (`python -m coordinator status|stop`), parsed by the real entry point
and run in-process: what they print, write and exit with. The heartbeat's own process (signals, its node's
exit) is tests/shell/heartbeat.bats; the protocol's functions are test_cluster.py, test_barrier.py and
test_heartbeat.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coordinator.__main__ import build_parser
from coordinator.barrier import arrive
from coordinator.cluster import Cluster, Endpoint, FailureRecord
from coordinator.membership import join_run, start_run
from coordinator.protocol_cli import dispatch, protocol_root
from rollout_engine.exits import Exit
from tests.unit.coordinator.fakes import Beaters

ME = Endpoint("node-0", "10.0.0.1", 4242)
QUICK = {"heartbeat_interval_s": 0.05, "dead_after_s": 0.5, "poll_s": 0.02}


def cli(*argv: str) -> int:
    """`python -m coordinator ARGV...` as run.sh's users call it, in this process: its exit code."""
    return dispatch(build_parser().parse_args(list(argv)))


def test_status_shows_each_rank_s_host_heartbeat_state_and_last_barrier(
    tmp_path: Path, beaters: Beaters, capsys: pytest.CaptureFixture[str]
) -> None:
    record = start_run(tmp_path, 3, [2, 1, 1], me=ME, **QUICK)
    cluster = Cluster(tmp_path, record.run_id)
    beaters.start(cluster, 0)
    for rank in (1, 2):
        join_run(tmp_path, rank, 3, [2, 1, 1], wait_s=5, me=Endpoint(f"node-{rank}", "a", 10 + rank), poll_s=0.02)
    beaters.start(cluster, 2)
    for rank in (0, 2):
        arrive(Cluster(tmp_path, record.run_id, rank=rank), 0, "start")
        arrive(Cluster(tmp_path, record.run_id, rank=rank), 1, "rollout_done")
    cluster.fail(FailureRecord(1, 1, "train_rollout", "rollout exited 1", 1, "node-1", 11))
    capsys.readouterr()
    assert cli("status", "--log-path", str(tmp_path), "--window", "0.3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"run {record.run_id}: master node-0 10.0.0.1 (pid 4242), 3 nodes"
    assert lines[1] == "rank weights 2,1,1; on rank failure: abort"
    assert lines[2].split() == ["rank", "host", "pid", "heartbeat", "state", "last", "barrier"]
    rows = [line.split(None, 4) for line in lines[3:]]  # rank, host, pid, then the rest
    assert [row[:3] for row in rows] == [["0", "node-0", "4242"], ["1", "node-1", "11"], ["2", "node-2", "12"]]
    assert re.fullmatch(r"seq \d+ +alive +iter_0001 rollout_done", f"{rows[0][3]} {rows[0][4]}")
    assert re.fullmatch(r"- +failed: rollout exited 1 +-", f"{rows[1][3]} {rows[1][4]}")
    assert re.fullmatch(r"seq \d+ +alive +iter_0001 rollout_done", f"{rows[2][3]} {rows[2][4]}")
    assert len(lines) == 6


def test_a_second_stop_request_keeps_the_first_one_s_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every node reports why the run stopped: the first request's reason, whoever asks again."""
    record = start_run(tmp_path, 2, [1, 1], me=ME, **QUICK)
    assert cli("stop", "--log-path", str(tmp_path), "--reason", "operator: disk full") == 0
    assert f"asked run {record.run_id} to stop: operator: disk full" in capsys.readouterr().err
    assert cli("stop", "--log-path", str(tmp_path), "--reason", "SIGTERM on the master") == 0
    assert f"run {record.run_id} was already asked to stop: operator: disk full" in capsys.readouterr().err
    stop = json.loads(Cluster(tmp_path, record.run_id).paths.stop.read_text())
    assert (stop["reason"], stop["rank"]) == ("operator: disk full", None)
    assert cli("status", "--log-path", str(tmp_path), "--window", "0.05") == 0
    assert "stop requested: operator: disk full" in capsys.readouterr().out.splitlines()


def test_a_split_deployment_s_rollout_and_update_runs_coordinate_apart_beside_a_both_run(
    tmp_path: Path, beaters: Beaters
) -> None:
    """--group rollout|update: each run's files under <log>/roles/<group>/cluster/; a master beating on the log
    path's own run (--rl-phase both) refuses neither, and a stop of one group asks that group's run only."""
    both = start_run(tmp_path, 3, [1, 1, 1], me=ME, **QUICK)
    beaters.start(Cluster(tmp_path, both.run_id), 0)
    roots = {group: protocol_root(str(tmp_path), group) for group in ("rollout", "update")}
    runs = {group: start_run(root, 2, [1, 1], me=ME, alive_window_s=0.5, **QUICK) for group, root in roots.items()}
    assert len({both.run_id, runs["rollout"].run_id, runs["update"].run_id}) == 3
    rollout, update = (Cluster(roots[g], runs[g].run_id) for g in ("rollout", "update"))
    assert rollout.run_dir.is_dir() and update.run_dir.is_dir()
    assert rollout.run_dir.is_relative_to(tmp_path / "roles" / "rollout" / "cluster")
    assert update.run_dir.is_relative_to(tmp_path / "roles" / "update" / "cluster")
    assert Cluster(tmp_path, both.run_id).run_dir.is_dir()
    assert not Cluster(tmp_path, runs["rollout"].run_id).run_dir.exists()
    assert cli("stop", "--log-path", str(tmp_path), "--group", "rollout", "--reason", "test") == 0
    assert rollout.stop_request() is not None
    assert update.stop_request() is None and Cluster(tmp_path, both.run_id).stop_request() is None


def test_a_run_id_that_names_no_run_is_bad_input_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start_run(tmp_path, 2, [1, 1], me=ME, **QUICK)
    assert cli("status", "--log-path", str(tmp_path), "--run-id", "nope") == Exit.BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"[baton] error: --run-id nope names no run on {tmp_path} (")
    assert err.endswith("/cluster/runs/nope is missing)")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("stop", "--log-path", str(empty), "--reason", "x") == Exit.BAD_INPUT
    assert f"--log-path {empty} has no cluster/run.json: no master has started there" in capsys.readouterr().err
    assert not (empty / "cluster").exists()  # nothing written
