"""Barriers: all arrive, or the waiter stops at once when a rank is gone, the run stops, or it is evicted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.barrier import BarrierTimeout, BarrierWait, arrivals, arrive, wait_barrier
from coordinator.cluster import Cluster, Evicted, Eviction, FailureRecord, RankFailed, RunStopped, StopRequest
from coordinator.heartbeat import LivenessWatcher
from rollout_engine.errors import ConfigError
from tests.unit.coordinator.fakes import Beaters, old_run

QUICK = {"poll_s": 0.02}


def node(log: Path, rank: int, run_id: str = "run1") -> Cluster:
    return Cluster(log, run_id, rank=rank)


def later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    """Run `action` in a thread after `seconds`."""
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


def test_the_barrier_opens_when_every_rank_has_arrived(tmp_path: Path) -> None:
    for rank in (0, 2):
        arrive(node(tmp_path, rank), 3, "rollout_done", host=f"n{rank}", pid=10 + rank)
    thread = later(0.1, lambda: arrive(node(tmp_path, 1), 3, "rollout_done"))
    result = wait_barrier(node(tmp_path, 0), 3, "rollout_done", [0, 1, 2], None, **QUICK)
    thread.join()
    assert sorted(result.arrivals) == [0, 1, 2]
    assert (result.arrivals[2].host, result.arrivals[2].pid, result.arrivals[2].run_id) == ("n2", 12, "run1")
    assert 0.05 < result.waited_s < 1
    assert node(tmp_path, 0).barrier_dir(3, "rollout_done").parts[-4:] == (
        "run1",
        "barriers",
        "iter_0003",
        "rollout_done",
    )


def test_arriving_twice_is_harmless(tmp_path: Path) -> None:
    arrive(node(tmp_path, 1), 0, "start")
    arrive(node(tmp_path, 1), 0, "start")
    assert list(arrivals(node(tmp_path, 0), 0, "start")) == [1]
    assert wait_barrier(node(tmp_path, 1), 0, "start", [1], None, **QUICK).arrivals[1].rank == 1


def test_temp_files_of_a_writer_are_never_counted(tmp_path: Path) -> None:
    barrier = node(tmp_path, 0).barrier_dir(0, "start")
    barrier.mkdir(parents=True)
    (barrier / ".rank_1.json.x1y2.tmp").write_text('{"rank": 1, "ho')  # torn: the writer has not renamed it yet
    arrive(node(tmp_path, 0), 0, "start")
    assert list(arrivals(node(tmp_path, 0), 0, "start")) == [0]
    with pytest.raises(BarrierTimeout):
        wait_barrier(node(tmp_path, 0), 0, "start", [0, 1], None, timeout_s=0.1, **QUICK)


def test_a_failure_flag_wakes_the_waiter_at_once(tmp_path: Path) -> None:
    failure = FailureRecord(2, 3, "rollout", "rollout exited 1", 1, "n2", 22)
    thread = later(0.15, lambda: node(tmp_path, 2).fail(failure))
    started = time.monotonic()
    with pytest.raises(RankFailed) as caught:
        wait_barrier(node(tmp_path, 0), 3, "rollout_done", [0, 1, 2], None, **QUICK)
    thread.join()
    assert time.monotonic() - started < 0.6
    assert caught.value.rank == 2
    assert str(caught.value) == "rank 2: failed in rollout of iteration 3: rollout exited 1"
    assert caught.value.exit_code == 3


def test_a_rank_whose_heartbeat_stops_is_dead(tmp_path: Path, beaters: Beaters) -> None:
    cluster = node(tmp_path, 0)
    stop_rank_1 = beaters.start(cluster, 1)
    beaters.start(cluster, 0)
    watcher = LivenessWatcher(cluster, [0, 1], dead_after_s=0.3)
    thread = later(0.2, stop_rank_1.set)
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1: dead: no heartbeat change seen for \d s"):
        wait_barrier(cluster, 0, "start", [0, 1], watcher, **QUICK)
    thread.join()
    assert 0.45 < time.monotonic() - started < 1.5  # waited through the beats, stopped soon after the last


def test_a_long_phase_is_waited_through_while_the_others_beat(tmp_path: Path, beaters: Beaters) -> None:
    cluster = node(tmp_path, 0)
    beaters.start(cluster, 1)
    watcher = LivenessWatcher(cluster, [1], dead_after_s=0.2)
    thread = later(0.6, lambda: arrive(node(tmp_path, 1), 0, "train_done"))
    assert wait_barrier(cluster, 0, "train_done", [1], watcher, **QUICK).waited_s > 0.5  # three times dead_after_s
    thread.join()


def test_a_stop_request_ends_the_wait(tmp_path: Path) -> None:
    thread = later(0.1, lambda: node(tmp_path, 1).request_stop(StopRequest("rollout failed twice", 1, "n1", 5)))
    with pytest.raises(RunStopped, match="rank 1 on n1 asked: rollout failed twice") as caught:
        wait_barrier(node(tmp_path, 0), 0, "start", [0, 1], None, **QUICK)
    thread.join()
    assert caught.value.exit_code == 4


def test_eviction_stops_the_evicted_rank_and_fails_the_others(tmp_path: Path) -> None:
    node(tmp_path, 0).evict(Eviction(2, "no heartbeat for 30 s", 0, "n0", 3))
    with pytest.raises(Evicted, match="rank 2 was evicted: no heartbeat for 30 s") as caught:
        wait_barrier(node(tmp_path, 2), 0, "start", [0, 1], None, **QUICK)
    assert caught.value.exit_code == 5
    with pytest.raises(RankFailed, match="rank 2: evicted: no heartbeat for 30 s"):
        wait_barrier(node(tmp_path, 1), 0, "start", [0, 1, 2], None, **QUICK)
    arrive(node(tmp_path, 0), 0, "start")
    arrive(node(tmp_path, 1), 0, "start")
    assert wait_barrier(node(tmp_path, 1), 0, "start", [0, 1], None, **QUICK)  # the survivors go on without it


def test_continue_mode_the_waiters_drop_an_evicted_worker_and_only_the_masters_loss_fails_them(
    tmp_path: Path,
) -> None:
    """--on-rank-failure continue: a worker evicted by the master is dropped from the wait (result.gone); a
    worker's failure flag is the master's business; the master's failure ends a worker's wait."""
    from coordinator.cluster import NodeRecord
    from coordinator.heartbeat import PeerWatch

    master, worker = node(tmp_path, 0), node(tmp_path, 1)
    for rank in (1, 2):
        master.register(NodeRecord(rank, f"n{rank}", "a", 10 + rank, None, 0.0))
    master.fail(FailureRecord(2, 1, "train_rollout", "rollout exit 1", 1, "n2", 12))
    arrive(worker, 1, "train_rollout")
    on_worker = PeerWatch(worker, [0, 1, 2], 30, "continue")
    thread = later(0.2, lambda: arrive(master, 1, "train_rollout"))
    with pytest.raises(BarrierTimeout):  # rank 2 failed, not yet evicted: the worker waits for the verdict
        wait_barrier(
            worker, 1, "train_rollout", [0, 1, 2], None, timeout_s=0.5, drop=on_worker.drop, fatal=[0], **QUICK
        )
    thread.join()
    on_master = PeerWatch(master, [0, 1, 2], 30, "continue")
    result = wait_barrier(master, 1, "train_rollout", [0, 1, 2], None, drop=on_master.drop, fatal=[0], **QUICK)
    assert (result.ranks, result.gone) == ([0, 1], [2]) and master.evictions()[2].node_pid == 12
    result = wait_barrier(worker, 1, "train_rollout", [0, 1, 2], None, drop=on_worker.drop, fatal=[0], **QUICK)
    assert (result.ranks, result.gone) == ([0, 1], [2])
    master.fail(FailureRecord(0, 1, "update", "training exit 1", 1, "n0", 10))
    with pytest.raises(RankFailed, match="rank 0: failed in update"):
        wait_barrier(worker, 1, "update", [0, 1], None, drop=on_worker.drop, fatal=[0], **QUICK)


def test_a_newer_run_fences_the_waiters_of_an_older_one(tmp_path: Path) -> None:
    old = old_run(tmp_path)
    later(0.1, lambda: old_run(tmp_path)).join()  # a new master start rewrote run.json
    with pytest.raises(RunStopped, match=f"run {old.run_id} was superseded by run"):
        wait_barrier(node(tmp_path, 1, old.run_id), 0, "start", [0, 1], None, **QUICK)


def test_a_deadline_names_the_missing_ranks_and_ticks_report_progress(tmp_path: Path) -> None:
    arrive(node(tmp_path, 1), 4, "eval_done")
    ticks: list[BarrierWait] = []
    with pytest.raises(BarrierTimeout) as caught:
        wait = {"timeout_s": 0.3, "tick_s": 0.1, "on_tick": ticks.append, **QUICK}
        wait_barrier(node(tmp_path, 1), 4, "eval_done", [0, 1, 3], None, **wait)
    assert str(caught.value) == "barrier eval_done of iteration 4: ranks 0, 3 missing after 0.3 s"
    assert caught.value.missing == [0, 3] and caught.value.exit_code == 1
    assert 1 <= len(ticks) <= 3 and ticks[0].missing == [0, 3]


def test_phase_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"phase must be lower-case letters, digits, '_' or '-' \(got '../x'\)"):
        arrive(node(tmp_path, 0), 0, "../x")


def test_a_silent_master_that_finished_the_run_ends_the_wait_as_the_run_s_end(tmp_path: Path) -> None:
    from coordinator.cluster import FinishRecord, RunFinished

    watcher = LivenessWatcher(node(tmp_path, 1), [0, 1], dead_after_s=0.1)
    with pytest.raises(RankFailed, match="rank 0: dead"):
        wait_barrier(node(tmp_path, 1), 2, "plan", [0], watcher, **QUICK)
    node(tmp_path, 0).finish(FinishRecord("the master (rank 0) ran the run's last step and exited", "n0", 3))
    with pytest.raises(RunFinished, match="the run finished: the master") as caught:
        wait_barrier(node(tmp_path, 1), 2, "plan", [0], watcher, **QUICK)
    assert caught.value.exit_code == 6
    node(tmp_path, 0).fail(FailureRecord(0, 2, "update", "training exit 1", 1, "n0", 3))
    with pytest.raises(RankFailed, match="rank 0: failed in update"):  # a failure stays a failure
        wait_barrier(node(tmp_path, 1), 2, "plan", [0], watcher, **QUICK)
