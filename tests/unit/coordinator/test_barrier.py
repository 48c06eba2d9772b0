"""Barriers: all arrive, or the waiter stops at once when a rank is gone, the run stops, or it is evicted."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.barrier import (
    GROWN_S,
    LOOK_S,
    POLL_CAP_S,
    STEADY_S,
    BarrierTimeout,
    BarrierWait,
    arrivals,
    arrive,
    fail_barrier,
    grown,
    open_barrier,
    wait_barrier,
    wait_open,
)
from coordinator.cluster import Cluster, Evicted, Eviction, FailureRecord, RankFailed, RunStopped, StopRequest
from coordinator.heartbeat import Beat, LivenessWatcher, write_beat
from rollout_engine.errors import ConfigError
from tests.unit.coordinator.fakes import file_operations, old_run

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
    looks: list[BarrierWait] = []

    def rank_1_arrives_after_the_first_look(wait: BarrierWait) -> None:  # on_tick with tick_s=0: after every look
        looks.append(wait)
        arrive(node(tmp_path, 1), 3, "rollout_done")

    result = wait_barrier(
        node(tmp_path, 0), 3, "rollout_done", [0, 1, 2], None, on_tick=rank_1_arrives_after_the_first_look, tick_s=0
    )
    # it waited while rank 1 was missing, and opened at the next look after rank 1 arrived
    assert [wait.missing for wait in looks] == [[1]]
    assert sorted(result.arrivals) == [0, 1, 2]
    assert (result.arrivals[2].host, result.arrivals[2].pid, result.arrivals[2].run_id) == ("n2", 12, "run1")
    assert result.waited_s >= looks[0].waited_s  # the whole wait, on the waiter's clock
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


def test_a_failure_flag_ends_the_wait_at_the_next_look_at_the_others(tmp_path: Path) -> None:
    """The others' failure flags, evictions and heartbeats are read every LOOK_S of the waiter's clock (each
    poll reads only the arrivals): a flag written after the first look ends the wait LOOK_S after it."""
    failure = FailureRecord(2, 3, "rollout", "rollout exited 1", 1, "n2", 22)
    looks: list[BarrierWait] = []
    clock = [0.0]

    def rank_2_fails_after_the_first_look(wait: BarrierWait) -> None:  # on_tick with tick_s=0: after every look
        looks.append(wait)
        node(tmp_path, 2).fail(failure)
        clock[0] += LOOK_S / 4

    with pytest.raises(RankFailed) as caught:
        # timeout_s only catches a waiter that never sees the flag (it would wait for ever): a hang
        wait = {"timeout_s": 60, "on_tick": rank_2_fails_after_the_first_look, "tick_s": 0, **QUICK}
        wait_barrier(node(tmp_path, 0), 3, "rollout_done", [0, 1, 2], None, clock=lambda: clock[0], **wait)
    assert [wait.waited_s for wait in looks] == [0.0, LOOK_S / 4, LOOK_S / 2, 3 * LOOK_S / 4]
    assert caught.value.rank == 2
    assert str(caught.value) == "rank 2: failed in rollout of iteration 3: rollout exited 1"
    assert caught.value.exit_code == 3


class Seconds:
    """The watcher's clock, one second further after each look of the waiter (its on_tick with tick_s=0);
    rank 1 beats once a second until `beats_until` and arrives at `arrives_at`: no real time is involved."""

    def __init__(self, cluster: Cluster, beats_until: float, arrives_at: float | None = None) -> None:
        self.cluster, self.beats_until, self.arrives_at, self.now = cluster, beats_until, arrives_at, 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, wait: BarrierWait) -> None:
        self.now += 1
        if self.now <= self.beats_until:
            write_beat(self.cluster, 1, Beat(int(self.now), 0.0, "n1", 11))
        if self.now == self.arrives_at:
            arrive(node(self.cluster.log_path, 1, self.cluster.run_id), 0, "train_done")


def test_a_rank_whose_heartbeat_stops_is_dead(tmp_path: Path) -> None:
    cluster = node(tmp_path, 0)
    clock = Seconds(cluster, beats_until=5)
    watcher = LivenessWatcher(cluster, [1], dead_after_s=3, clock=clock)
    with pytest.raises(RankFailed, match=r"rank 1: dead: no heartbeat change seen for 3 s"):
        wait_barrier(cluster, 0, "start", [1], watcher, on_tick=clock.tick, tick_s=0, clock=clock, **QUICK)
    assert clock.now == 5 + 3  # waited through the beats, dead dead_after_s after the last one


def test_a_long_phase_is_waited_through_while_the_others_beat(tmp_path: Path) -> None:
    cluster = node(tmp_path, 0)
    clock = Seconds(cluster, beats_until=float("inf"), arrives_at=9)  # three times dead_after_s
    watcher = LivenessWatcher(cluster, [1], dead_after_s=3, clock=clock)
    result = wait_barrier(cluster, 0, "train_done", [1], watcher, on_tick=clock.tick, tick_s=0, clock=clock, **QUICK)
    assert sorted(result.arrivals) == [1] and clock.now == 9


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
    seconds = itertools.count()  # the waiter's clock: one second further at each reading, whatever the machine
    with pytest.raises(BarrierTimeout) as caught:
        wait = {"timeout_s": 3, "tick_s": 1, "on_tick": ticks.append, "clock": lambda: float(next(seconds)), **QUICK}
        wait_barrier(node(tmp_path, 1), 4, "eval_done", [0, 1, 3], None, **wait)
    assert str(caught.value) == "barrier eval_done of iteration 4: ranks 0, 3 missing after 3 s"
    assert caught.value.missing == [0, 3] and caught.value.exit_code == 1
    # a tick every tick_s of waiting until the deadline: after 1 s and 2 s (at 3 s the deadline ends it)
    assert [(tick.missing, tick.waited_s) for tick in ticks] == [([0, 3], 1.0), ([0, 3], 2.0)]


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


def test_on_poll_ticks_during_the_wait_and_what_it_raises_ends_it(tmp_path: Path) -> None:
    class Signalled(Exception):
        pass

    polls: list[float] = []

    def driver_watches() -> None:  # the driver's watches: a signal seen at the third poll ends the wait
        polls.append(time.monotonic())
        if len(polls) == 3:
            raise Signalled

    with pytest.raises(Signalled):
        wait_barrier(node(tmp_path, 1), 2, "update", [0, 1], None, on_poll=driver_watches, **QUICK)
    assert len(polls) == 3


# -- two tiers: the master opens a barrier of every rank, a worker waits for its word --------------------------


def test_a_worker_goes_on_with_what_the_master_saw_once_it_opens_the_barrier(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        arrive(node(tmp_path, rank), 3, "rollout_done", data={"episodes": 10 + rank})
    looks: list[BarrierWait] = []

    def the_master_opens_after_the_first_look(wait: BarrierWait) -> None:
        looks.append(wait)
        if len(looks) == 1:
            open_barrier(node(tmp_path, 0), wait_barrier(node(tmp_path, 0), 3, "rollout_done", [0, 1, 2], None))

    worker = wait_open(
        node(tmp_path, 1), 3, "rollout_done", None, on_tick=the_master_opens_after_the_first_look, tick_s=0, **QUICK
    )
    assert [wait.missing for wait in looks] == [[0]]  # it waited for the master alone
    assert worker.ranks == [0, 1, 2] and worker.gone == []
    assert {rank: arrival.data for rank, arrival in worker.arrivals.items()} == {
        r: {"episodes": 10 + r} for r in (0, 1, 2)
    }


def test_a_worker_learns_of_another_worker_s_loss_from_the_master_s_failure_flag(tmp_path: Path) -> None:
    node(tmp_path, 0).fail(
        FailureRecord(0, 3, "rollout", "rank 2: dead: no heartbeat change seen for 30 s", 1, "n0", 5)
    )
    with pytest.raises(RankFailed) as caught:
        wait_open(node(tmp_path, 1), 3, "rollout_done", None, timeout_s=60, **QUICK)
    assert (
        str(caught.value) == "rank 0: failed in rollout of iteration 3: rank 2: dead: no heartbeat change seen for 30 s"
    )
    assert caught.value.exit_code == 3


def test_a_worker_stops_at_its_next_poll_when_the_master_says_the_barrier_will_not_open(tmp_path: Path) -> None:
    looks: list[BarrierWait] = []

    def the_master_finds_rank_2_dead(wait: BarrierWait) -> None:
        looks.append(wait)
        fail_barrier(node(tmp_path, 0), 3, "rollout_done", "rank 2: dead: no heartbeat change seen for 30 s")

    with pytest.raises(RankFailed) as caught:
        wait_open(node(tmp_path, 1), 3, "rollout_done", None, on_tick=the_master_finds_rank_2_dead, tick_s=0, **QUICK)
    assert len(looks) == 1
    assert (
        str(caught.value)
        == "rank 0: failed in rollout_done of iteration 3: rank 2: dead: no heartbeat change seen for 30 s"
    )


def test_a_worker_waits_while_the_master_beats_and_stops_when_it_falls_silent(tmp_path: Path) -> None:
    cluster = node(tmp_path, 1)
    clock = [0.0]

    def a_second_per_look(wait: BarrierWait) -> None:
        clock[0] += 1
        if clock[0] <= 5:
            write_beat(cluster, 0, Beat(int(clock[0]), 0.0, "n0", 10))

    master = LivenessWatcher(cluster, [0], dead_after_s=3, clock=lambda: clock[0])
    with pytest.raises(RankFailed, match=r"^rank 0: dead: no heartbeat change seen for 3 s$"):
        wait_open(
            cluster, 3, "rollout_done", master, on_tick=a_second_per_look, tick_s=0, clock=lambda: clock[0], **QUICK
        )
    assert clock[0] == 5 + 3


def test_a_poll_reads_o_1_files_on_a_worker_and_o_ranks_on_the_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes 128 ranks affordable (docs/multinode.md "Scale"): a worker's poll reads the same few files
    however many ranks the run has; only the master's grows with them."""

    def one_poll(ranks: int, rank: int) -> int:
        log = tmp_path / f"n{ranks}"
        run = old_run(log, num_nodes=ranks, rank_weights=[1] * ranks).run_id
        for r in range(1, ranks):
            write_beat(node(log, r, run), r, Beat(1, 0.0, "h", r))
            arrive(node(log, r, run), 3, "rollout_done")
        cluster = node(log, rank, run)
        with file_operations(monkeypatch) as calls, pytest.raises(BarrierTimeout):
            if rank == 0:  # rank 0 has not arrived: the master's poll looks at every other rank
                wait_barrier(
                    cluster,
                    3,
                    "rollout_done",
                    list(range(ranks)),
                    LivenessWatcher(cluster, list(range(ranks)), 30),
                    timeout_s=0,
                    **QUICK,
                )
            else:
                wait_open(cluster, 3, "rollout_done", LivenessWatcher(cluster, [0], 30), timeout_s=0, **QUICK)
        return len(calls)

    assert one_poll(8, 1) == one_poll(64, 1) <= 14
    assert one_poll(64, 0) > 64 > one_poll(8, 0)


def test_a_long_wait_backs_off_to_its_caps_and_still_opens_within_a_poll_of_each_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait's polls grow with its age (STEADY_S at the base, then to POLL_CAP_S): an hour's wait costs a fifth of
    the polls, and the barrier still opens within the master's poll plus a worker's (under 3 s) after the last
    arrival, however long it lasted."""
    clock, sleeps = [0.0], []
    master, worker = node(tmp_path, 0), node(tmp_path, 1)
    arrive(master, 3, "rollout_done")

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds
        if clock[0] >= 600 and not (worker.barrier_dir(3, "rollout_done") / "rank_1.json").exists():
            arrive(worker, 3, "rollout_done")  # the last arrival, ten minutes in

    monkeypatch.setattr(time, "sleep", sleep)
    result = wait_barrier(master, 3, "rollout_done", [0, 1], None, clock=lambda: clock[0])
    assert sleeps[0] == 0.2 and max(sleeps) == sleeps[-1] == POLL_CAP_S
    assert len(sleeps) < 600 / POLL_CAP_S + 120  # at 0.2 s for ever: 3,000 polls
    assert result.waited_s - 600 <= POLL_CAP_S
    # the worker: from the master's word written at 600 s, one poll at most
    clock[0], sleeps[:] = 0.0, []

    def sleep_until_the_word(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds
        if clock[0] >= 600 and not master.paths.barrier_open(3, "rollout_done").exists():
            open_barrier(master, result)

    monkeypatch.setattr(time, "sleep", sleep_until_the_word)
    word = wait_open(worker, 3, "rollout_done", None, clock=lambda: clock[0])
    assert word.waited_s - 600 <= POLL_CAP_S and max(sleeps) == POLL_CAP_S
    assert [grown(0.2, POLL_CAP_S, age) for age in (0, STEADY_S, STEADY_S + GROWN_S, 3600)] == [0.2, 0.2, 1.0, 1.0]
