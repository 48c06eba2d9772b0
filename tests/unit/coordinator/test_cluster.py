"""Starting and joining a run: fencing by run_id, pinned values, live masters judged by observation."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coordinator.cluster import (
    Cluster,
    Endpoint,
    Evicted,
    Eviction,
    FailureRecord,
    JoinTimeout,
    MasterAlive,
    StopRequest,
    load_pinned,
    load_run,
)
from coordinator.membership import join_run, start_run
from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout
from tests.unit.coordinator.fakes import Beaters, old_run

ME = Endpoint("node-0", "10.0.0.1", 4242)
QUICK = {"heartbeat_interval_s": 0.05, "dead_after_s": 0.5, "poll_s": 0.02}


def test_start_run_writes_the_record_the_pin_and_rank_0(tmp_path: Path) -> None:
    record = start_run(tmp_path, 2, [2, 1], me=ME, vllm_port=8100, torchrun_port=29500, start_iteration=3, **QUICK)
    assert load_run(tmp_path) == record
    on_disk = json.loads((Layout(tmp_path).run_record).read_text())
    assert on_disk["master"] == {"host": "node-0", "addr": "10.0.0.1", "pid": 4242}
    assert (on_disk["torchrun_port"], on_disk["start_iteration"], on_disk["on_rank_failure"]) == (29500, 3, "abort")
    cluster = Cluster(tmp_path, record.run_id)
    assert cluster.record() == record
    assert cluster.nodes()[0].vllm_port == 8100
    pinned = load_pinned(tmp_path)
    assert pinned is not None
    assert (pinned.num_nodes, pinned.rank_weights, pinned.first_run_id) == (2, [2, 1], record.run_id)


def test_every_master_start_gets_a_new_run_id_and_leaves_the_old_run_alone(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    old_files = sorted(p.name for p in Cluster(tmp_path, old.run_id).run_dir.rglob("*"))
    new = start_run(tmp_path, 2, [1, 1], me=ME, alive_window_s=0.1, **QUICK)
    assert new.run_id != old.run_id
    assert load_run(tmp_path) == new
    assert sorted(p.name for p in Cluster(tmp_path, old.run_id).run_dir.rglob("*")) == old_files
    assert Cluster(tmp_path, old.run_id).superseded_by() == new


def test_start_run_is_refused_while_the_earlier_master_still_beats(tmp_path: Path, beaters: Beaters) -> None:
    old = old_run(tmp_path, host="node-9", pid=77, dead_after_s=5)
    beaters.start(Cluster(tmp_path, old.run_id), 0)
    readings = itertools.count()

    def clock() -> float:  # the watch's clock: one second further at each reading, whatever the machine
        return float(next(readings))

    with pytest.raises(MasterAlive, match=rf"run {old.run_id} of node-9 \(pid 77\) still beats; stop it first"):
        start_run(tmp_path, 2, [1, 1], me=ME, alive_window_s=1000, clock=clock, **QUICK)
    # decided as soon as a beat changed, not at the end of the window: the beater changes the heartbeat every
    # 0.02 s and the watch reads its clock a few times per 0.02 s poll, so only a beater that hangs for
    # seconds lets 1000 readings pass first
    assert next(readings) < 1000
    assert load_run(tmp_path) == old


def test_a_master_gone_from_this_host_is_not_watched_for_the_whole_window(tmp_path: Path) -> None:
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    old_run(tmp_path, host=socket.gethostname(), pid=reaped.pid)
    waits: list[str] = []
    start_run(tmp_path, 2, [1, 1], me=ME, alive_window_s=30, on_wait=waits.append, **QUICK)
    assert waits == []  # never watched: no "watching its heartbeat" line, and no wait for the 30 s window


def test_pinned_values_refuse_a_later_start_with_other_ones_naming_both(tmp_path: Path) -> None:
    first = start_run(tmp_path, 2, [1, 1], me=ME, **QUICK)
    with pytest.raises(ConfigError) as caught:
        start_run(tmp_path, 3, [1, 1, 1], me=ME, alive_window_s=0.1, **QUICK)
    message = str(caught.value)
    assert (
        "--num-nodes 3 --rank-weights 1,1,1 differ from this experiment's --num-nodes 2 --rank-weights 1,1" in message
    )
    assert "start with the pinned values, or use a new --log-path" in message
    assert load_run(tmp_path) == first


def test_bad_values_are_reported_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        start_run(tmp_path, 2, [1, 0, 1], me=ME, heartbeat_interval_s=5, dead_after_s=6, on_rank_failure="retry")
    assert caught.value.problems == [
        "rank_weights needs exactly 2 values for num_nodes 2 (got [1, 0, 1])",
        "rank_weights values must be integers >= 1 (got [1, 0, 1])",
        "dead_after_s must be at least twice heartbeat_interval_s 5 (got 6);"
        " a live rank would look dead between two beats",
        "on_rank_failure must be one of abort, continue (got 'retry')",
    ]
    assert not tmp_path.joinpath("cluster").exists()


def test_join_run_joins_a_beating_master_and_registers(tmp_path: Path, beaters: Beaters) -> None:
    record = start_run(tmp_path, 3, [1, 1, 1], me=ME, **QUICK)
    beaters.start(Cluster(tmp_path, record.run_id), 0)
    lines: list[str] = []
    joined = join_run(tmp_path, 2, 3, [1, 1, 1], wait_s=2, me=Endpoint("node-2", "10.0.0.3", 5), on_wait=lines.append)
    assert joined == record
    assert Cluster(tmp_path, record.run_id).nodes()[2].host == "node-2"
    assert all("watching its heartbeat" in line for line in lines)


def test_join_run_is_not_fooled_by_a_run_whose_master_is_gone(tmp_path: Path) -> None:
    stale = old_run(tmp_path)
    lines: list[str] = []
    with pytest.raises(JoinTimeout, match="whose heartbeat has stopped: waiting for a new master"):
        join_run(tmp_path, 1, 2, [1, 1], wait_s=0.6, me=ME, poll_s=0.02, on_wait=lines.append)
    who = f"names run {stale.run_id} of master gone-host (pid 999999)"
    assert lines[-1].endswith(f"{who}, whose heartbeat has stopped: waiting for a new master")
    assert not Cluster(tmp_path, stale.run_id).nodes()


def test_join_run_waits_through_a_stale_run_for_the_new_master(tmp_path: Path, beaters: Beaters) -> None:
    old_run(tmp_path)
    started: list[str] = []

    def new_master() -> None:
        time.sleep(0.3)
        record = start_run(tmp_path, 2, [1, 1], me=ME, alive_window_s=0.05, **QUICK)
        beaters.start(Cluster(tmp_path, record.run_id), 0)
        started.append(record.run_id)

    thread = threading.Thread(target=new_master)
    thread.start()
    joined = join_run(tmp_path, 1, 2, [1, 1], wait_s=3, me=ME, poll_s=0.02)
    thread.join()
    assert [joined.run_id] == started


def test_join_run_refuses_other_values_than_the_masters_naming_both(tmp_path: Path, beaters: Beaters) -> None:
    record = start_run(tmp_path, 2, [2, 1], me=ME, **QUICK)
    beaters.start(Cluster(tmp_path, record.run_id), 0)
    with pytest.raises(ConfigError, match="this node has --num-nodes 2 --rank-weights 1,1 but the running master"):
        join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=ME, poll_s=0.02)
    with pytest.raises(ConfigError, match=r"has --num-nodes 2 --rank-weights 2,1; give every node the same values"):
        join_run(tmp_path, 1, 3, [1, 1, 1], wait_s=2, me=ME, poll_s=0.02)


def test_join_run_refuses_a_rank_taken_by_another_node_and_bad_ranks(tmp_path: Path, beaters: Beaters) -> None:
    record = start_run(tmp_path, 2, [1, 1], me=ME, **QUICK)
    beaters.start(Cluster(tmp_path, record.run_id), 0)
    join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=Endpoint("node-1", "a", 1), poll_s=0.02)
    join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=Endpoint("node-1", "a", 1), poll_s=0.02)  # the same node again
    with pytest.raises(ConfigError, match=r"rank 1 already joined run .* from node-1 \(pid 1\)"):
        join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=Endpoint("node-7", "b", 2), poll_s=0.02)
    with pytest.raises(ConfigError, match=r"a worker's rank must be in 1..1 for num_nodes 2 \(got 0\)"):
        join_run(tmp_path, 0, 2, [1, 1])
    with pytest.raises(ConfigError, match="num_nodes 1 has no workers to join"):
        join_run(tmp_path, 1, 1, [1])


def test_join_run_does_not_join_a_run_asked_to_stop(tmp_path: Path) -> None:
    record = start_run(tmp_path, 2, [1, 1], me=ME, **QUICK)
    Cluster(tmp_path, record.run_id).request_stop(StopRequest("operator request", None, "h", 1))
    with pytest.raises(JoinTimeout, match="which was asked to stop: waiting for a new master"):
        join_run(tmp_path, 1, 2, [1, 1], wait_s=0.3, me=ME, poll_s=0.02)


def test_join_run_lets_a_rank_whose_registration_was_evicted_join_again(tmp_path: Path, beaters: Beaters) -> None:
    """--on-rank-failure continue: the restarted rank registers anew; the eviction covered its old incarnation."""
    record = start_run(tmp_path, 2, [1, 1], me=ME, on_rank_failure="continue", **QUICK)
    cluster = Cluster(tmp_path, record.run_id)
    beaters.start(cluster, 0)
    join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=Endpoint("node-1", "a", 1), started=11, poll_s=0.02)
    reason = "dead: no heartbeat change seen for 30 s"
    cluster.evict(Eviction(1, reason, 0, "m", 7, node_host="node-1", node_pid=1, node_started=11))
    assert cluster.members(2) == [0]
    join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=Endpoint("node-1", "a", 2), started=12, poll_s=0.02)
    assert cluster.nodes()[1].pid == 2 and cluster.members(2) == [0, 1]


def test_join_run_lets_a_rank_restarted_with_the_same_host_and_pid_join_again(tmp_path: Path, beaters: Beaters) -> None:
    """A container restarted with the same host name and pid is another start of the node (its start time
    differs): the eviction of the earlier start is not its own, and it joins (issue 24, bug 5)."""
    record = start_run(tmp_path, 2, [1, 1], me=ME, on_rank_failure="continue", **QUICK)
    cluster = Cluster(tmp_path, record.run_id)
    beaters.start(cluster, 0)
    node = Endpoint("node-1", "a", 1)
    join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=node, started=500, poll_s=0.02)
    reason = "dead: no heartbeat change seen for 30 s"
    cluster.evict(Eviction(1, reason, 0, "m", 7, node_host="node-1", node_pid=1, node_started=500))
    with pytest.raises(Evicted):  # the evicted start itself, asking again, is still out
        join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=node, started=500, poll_s=0.02)
    assert join_run(tmp_path, 1, 2, [1, 1], wait_s=2, me=node, started=900, poll_s=0.02) == record
    assert cluster.nodes()[1].incarnation == ("node-1", 1, 900) and cluster.members(2) == [0, 1]
    assert Cluster(tmp_path, record.run_id, rank=1, me=("node-1", 1, 900)).standing() is None


def test_a_node_s_start_is_its_pid_s_start_time_on_this_host() -> None:
    """The start time of a pid as coordinator/driver/procs.py reads it (field 22 of /proc/<pid>/stat); 0: none."""
    import os

    from coordinator.membership import pid_started

    stat = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert pid_started(os.getpid()) == int(stat[19]) > 0
    with subprocess.Popen(["sleep", "0"]) as gone:
        gone.wait()
    assert pid_started(gone.pid) == 0


def test_not_running_tells_a_running_run_from_an_earlier_run_s_record(tmp_path: Path, beaters: Beaters) -> None:
    """run.sh --stop asks only a running multi-node run to stop (issue 24, bug 6): a master seen beating runs;
    a run that finished, was asked to stop, or whose master's heartbeat stays frozen does not."""
    from coordinator.cluster import FinishRecord
    from coordinator.membership import not_running

    assert not_running(tmp_path / "none") == f"{tmp_path / 'none' / 'cluster' / 'run.json'} names no run"
    old_run(tmp_path / "frozen", dead_after_s=0.2)
    lines: list[str] = []
    why = not_running(tmp_path / "frozen", poll_s=0.02, on_wait=lines.append)
    assert why == "the heartbeat of its master gone-host (pid 999999) has not changed for 0.2 s"
    assert len(lines) == 1 and lines[0].endswith("watching its heartbeat to tell whether it runs")
    record = start_run(tmp_path / "live", 2, [1, 1], me=ME, **QUICK)
    cluster = Cluster(tmp_path / "live", record.run_id)
    beaters.start(cluster, 0)
    assert not_running(tmp_path / "live", poll_s=0.02) is None
    cluster.finish(FinishRecord("the master ran the run's last step", "node-0", 4242))
    assert not_running(tmp_path / "live") == "its master node-0 (pid 4242) ran its last step (finished.json)"
    stopped = start_run(tmp_path / "stopped", 2, [1, 1], me=ME, **QUICK)
    Cluster(tmp_path / "stopped", stopped.run_id).request_stop(StopRequest("operator", None, "h", 1))
    assert not_running(tmp_path / "stopped") == "it was asked to stop already (stop.json)"


def test_the_waits_of_start_and_join_tick_on_poll_and_end_on_what_it_raises(tmp_path: Path) -> None:
    class Signalled(Exception):
        pass

    polls: list[str] = []

    def driver_watches(who: str) -> None:  # the driver's watches: a signal seen at the third poll ends the wait
        polls.append(who)
        if polls.count(who) == 3:
            raise Signalled

    with pytest.raises(Signalled):  # no master yet: the join waits
        join_run(tmp_path, 1, 2, [1, 1], wait_s=30, me=ME, poll_s=0.02, on_poll=lambda: driver_watches("join"))
    old_run(tmp_path, host=socket.gethostname(), pid=1, dead_after_s=30)  # a master elsewhere, watched for 30 s
    with pytest.raises(Signalled):
        start_run(tmp_path, 2, [1, 1], me=ME, **QUICK, on_poll=lambda: driver_watches("start"))
    assert polls == ["join"] * 3 + ["start"] * 3


def test_a_rank_file_a_stale_listing_lacks_is_found_by_name_and_one_a_name_lookup_misses_by_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshfs lists a folder up to 20 s late, GlusterFS with NFS-like caches finds a new name 5 s late: the
    protocol's readers look both ways (os.scandir / os.listdir stand in for the stale listing, Path.exists for
    the stale name)."""
    record = start_run(tmp_path, 2, [1, 1], me=ME, vllm_port=8100, torchrun_port=29500, **QUICK)
    cluster = Cluster(tmp_path, record.run_id, rank=0)
    cluster.fail(FailureRecord(1, 1, "train_rollout", "boom", 1, "node-1", 7))
    cluster.request_stop(StopRequest("a person asked", None, "node-9", 1))
    monkeypatch.setattr("coordinator.cluster.os.scandir", lambda _path: iter(()))
    monkeypatch.setattr("coordinator.cluster.os.listdir", lambda _path: [])
    assert cluster.failures()[1].reason == "boom" and cluster.stop_request() is not None
    monkeypatch.undo()
    monkeypatch.setattr(Path, "exists", lambda _self: False)
    assert cluster.failures()[1].reason == "boom" and cluster.stop_request() is not None
    monkeypatch.undo()
    monkeypatch.setattr("coordinator.cluster.os.scandir", lambda _path: iter(()))
    monkeypatch.setattr("coordinator.cluster.os.listdir", lambda _path: [])
    monkeypatch.setattr(Path, "exists", lambda _self: False)
    assert cluster.failures() == {} and cluster.stop_request() is None  # neither way sees them: not yet
