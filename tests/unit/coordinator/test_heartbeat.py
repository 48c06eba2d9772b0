"""Heartbeats: liveness on the observer's clock (a fake one here), and the beating loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from coordinator.cluster import Cluster, Eviction, RunStopped, StopRequest
from coordinator.heartbeat import FAILED, Beat, LivenessWatcher, read_beats, run_heartbeat, write_beat
from tests.unit.coordinator.fakes import file_operations, old_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(cluster: Cluster, rank: int, seq: int, wall_time: float = 0.0) -> None:
    write_beat(cluster, rank, Beat(seq, wall_time, "h", 7))


def test_beat_line_round_trips_and_garbage_is_not_a_beat() -> None:
    b = Beat(12, 1700000000.25, "node-1", 4242)
    assert Beat.parse(b.line()) == b
    assert Beat.parse("") is None
    assert Beat.parse("12 1700000000.25 node-1") is None
    assert Beat.parse("x 1 h 2") is None


def test_a_rank_that_never_beats_is_dead_after_dead_after_s_from_the_start_of_watching(tmp_path: Path) -> None:
    clock = FakeClock()
    watcher = LivenessWatcher(Cluster(tmp_path, "r1"), [0, 1], dead_after_s=30, clock=clock)
    clock.now += 29.9
    watcher.observe()
    assert watcher.dead() == []
    clock.now += 0.1
    assert watcher.dead() == [0, 1]
    assert not watcher.confirmed(0)


def test_a_changing_heartbeat_is_alive_and_dead_once_it_stops_changing(tmp_path: Path) -> None:
    cluster, clock = Cluster(tmp_path, "r1"), FakeClock()
    watcher = LivenessWatcher(cluster, [0], dead_after_s=30, clock=clock)
    for seq in range(1, 5):
        beat(cluster, 0, seq)
        watcher.observe()
        clock.now += 20  # less than dead_after_s between changes
        assert watcher.dead() == []
    assert watcher.confirmed(0)
    assert watcher.last_beat(0) == Beat(4, 0.0, "h", 7)
    clock.now += 9.9
    watcher.observe()  # same content: no change
    assert watcher.dead() == []
    clock.now += 0.1
    assert watcher.dead() == [0]
    assert not watcher.confirmed(0)
    assert watcher.silent_s(0) == 30


def test_an_unchanging_file_never_proves_life_whatever_its_wall_time_says(tmp_path: Path) -> None:
    """A heartbeat left by a dead process, even one stamped 'now' or in the future, counts from first sight."""
    cluster, clock = Cluster(tmp_path, "r1"), FakeClock()
    beat(cluster, 0, 99, wall_time=4e9)  # another host's clock, far ahead: never compared with ours
    watcher = LivenessWatcher(cluster, [0], dead_after_s=5, clock=clock)
    clock.now += 3
    watcher.observe()  # first sight: the timer restarts here
    assert not watcher.confirmed(0)
    clock.now += 4.9
    watcher.observe()
    assert watcher.dead() == []
    clock.now += 0.1
    assert watcher.dead() == [0]


def test_a_file_that_merely_appears_is_not_proof_of_life(tmp_path: Path) -> None:
    cluster, clock = Cluster(tmp_path, "r1"), FakeClock()
    watcher = LivenessWatcher(cluster, [0], dead_after_s=5, clock=clock)
    watcher.observe()
    beat(cluster, 0, 1)
    watcher.observe()
    assert not watcher.confirmed(0)
    beat(cluster, 0, 2)
    watcher.observe()
    assert watcher.confirmed(0)


def test_temp_files_and_torn_content_are_never_read(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "r1")
    cluster.heartbeat_dir.mkdir(parents=True)
    (cluster.heartbeat_dir / ".rank_0.abc.tmp").write_text("5 1.0 h")  # a writer's half-written temp file
    (cluster.heartbeat_dir / "rank_1").write_text("5 1.0")  # not a whole beat
    beat(cluster, 2, 3)
    assert read_beats(cluster) == {2: Beat(3, 0.0, "h", 7)}


def test_run_heartbeat_renews_by_one_each_beat_until_told_to_stop(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "r1", rank=1)
    seen: list[int] = []

    def wait(seconds: float) -> bool:
        seen.append(read_beats(cluster)[1].seq)
        return len(seen) == 4

    assert run_heartbeat(cluster, 1, 0.05, wait, host="h", pid=7) is None
    assert seen == [1, 2, 3, 4]
    # a restarted beater continues the sequence
    seen.clear()
    run_heartbeat(cluster, 1, 0.05, wait, host="h", pid=8)
    assert seen == [5, 6, 7, 8]


def test_run_heartbeat_ends_by_itself_on_stop_and_on_eviction(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "r1", rank=1)
    stop = threading.Event()
    thread_result: list[object] = []
    worker = threading.Thread(
        target=lambda: thread_result.append(run_heartbeat(cluster, 1, 0.05, stop.wait, host="h", pid=7))
    )
    worker.start()
    cluster.request_stop(StopRequest("operator", None, "h", 1))
    worker.join(timeout=1.5)
    assert not worker.is_alive()
    assert isinstance(thread_result[0], RunStopped)

    other = Cluster(tmp_path, "r2", rank=2)
    other.evict(Eviction(2, "silent", 0, "h", 1))
    ended = run_heartbeat(other, 2, 0.05, stop.wait, host="h", pid=7)
    assert ended is not None and ended.exit_code == 5
    assert "silent" in str(ended)


def test_peer_watch_ends_the_heartbeat_when_a_seen_peer_falls_silent_or_fails(tmp_path: Path) -> None:
    """Abort mode: the heartbeat stops its node when another rank failed or, once seen beating, fell silent;
    a rank that never beat yet (still joining) is left to the barriers."""
    from coordinator.cluster import FailureRecord
    from coordinator.heartbeat import PeerWatch

    clock = FakeClock()
    cluster = Cluster(tmp_path, "r1", rank=0)
    watch = PeerWatch(cluster, [0, 1, 2], dead_after_s=30)
    watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
    beat(cluster, 1, 1)
    assert watch() is None
    beat(cluster, 1, 2)  # rank 1 seen beating; rank 2 never beat
    clock.now += 10
    assert watch() is None
    clock.now += 31
    ended = watch()
    assert ended is not None and ended.exit_code == 3 and str(ended).startswith("rank 1: dead: no heartbeat change")
    cluster.fail(FailureRecord(2, 3, "update", "training exit 1", 1, "h", 9))
    ended = PeerWatch(cluster, [0, 1, 2], dead_after_s=30)()
    assert ended is not None and str(ended) == "rank 2: failed in update of iteration 3: training exit 1"


def test_continue_mode_the_master_evicts_a_silent_or_failed_worker_and_goes_on(tmp_path: Path) -> None:
    """--on-rank-failure continue: the master's watch evicts the worker's registration (once) and ends nothing;
    a worker restarted after its eviction registers anew, is a member again and is judged afresh."""
    from coordinator.cluster import FailureRecord, NodeRecord
    from coordinator.heartbeat import PeerWatch

    clock = FakeClock()
    cluster = Cluster(tmp_path, "r1", rank=0)
    for rank in (1, 2):
        cluster.register(NodeRecord(rank, f"node{rank}", "a", 100 + rank, None, 0.0))
    watch = PeerWatch(cluster, [0, 1, 2], dead_after_s=30, mode="continue")
    watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
    beat(cluster, 1, 1)
    beat(cluster, 2, 1)
    assert watch() is None
    beat(cluster, 1, 2)
    beat(cluster, 2, 2)
    assert watch() is None
    clock.now += 20
    beat(cluster, 2, 3)  # rank 2 beats on; rank 1 falls silent
    clock.now += 11
    assert watch() is None  # nothing ends the master
    eviction = cluster.evictions()[1]
    assert (eviction.node_host, eviction.node_pid) == ("node1", 101) and eviction.reason.startswith(
        "dead: no heartbeat"
    )
    assert cluster.members(3) == [0, 2]
    cluster.fail(FailureRecord(2, 1, "train_rollout", "rollout exit 1", 1, "node2", 102))
    assert watch() is None and cluster.members(3) == [0]
    assert Cluster(tmp_path, "r1", rank=2, me=("node2", 102, 0)).standing().exit_code == 5  # it learns it was evicted
    # rank 1 restarts: a new registration; the old eviction and the old failure flag are not its own
    cluster.register(NodeRecord(1, "node1", "a", 201, None, 0.0))
    assert cluster.members(3) == [0, 1]
    assert Cluster(tmp_path, "r1", rank=1, me=("node1", 201, 0)).standing() is None
    assert watch() is None and cluster.evicted(1) is None
    beat(cluster, 1, 3)
    clock.now += 5
    beat(cluster, 1, 4)
    assert watch() is None and cluster.members(3) == [0, 1]  # judged afresh: not evicted for the old silence
    # the old incarnation of rank 1, alive after a partition, learns that it was replaced
    assert "registered again" in str(Cluster(tmp_path, "r1", rank=1, me=("node1", 101, 0)).standing())


def test_continue_mode_a_worker_watches_only_the_master(tmp_path: Path) -> None:
    from coordinator.cluster import FailureRecord
    from coordinator.heartbeat import PeerWatch

    cluster = Cluster(tmp_path, "r1", rank=1)
    watch = PeerWatch(cluster, [0, 1, 2], dead_after_s=30, mode="continue")
    assert watch.ranks == [0]
    cluster.fail(FailureRecord(2, 1, "update", "x", 1, "h", 9))
    assert watch() is None  # rank 2 is the master's business
    master = Cluster(tmp_path, "r1", rank=0)
    master.fail(FailureRecord(0, 1, "update", "training exit 1", 1, "h", 8))
    assert watch() is None  # read when the master's beat says so, or every REGISTRATIONS_EVERY beats
    # the master's heartbeat, stopped on the node's way out, says FAILED in a last beat
    assert run_heartbeat(master, 0, 5.0, lambda seconds: True, host="h", pid=8) is None
    assert read_beats(master, [0])[0].word == FAILED
    ended = watch()
    assert ended is not None and ended.exit_code == 3 and str(ended).startswith("rank 0: failed in update")
    assert not cluster.evictions()


def test_a_worker_takes_the_silence_of_a_master_that_finished_the_run_for_the_run_s_end(tmp_path: Path) -> None:
    """A worker still running when the master ran the last step and exited (it rejoined, or it was still
    reloading its vLLM) is told the run finished (exit 6: run.sh exits 0), not that the master died."""
    from coordinator.cluster import FinishRecord
    from coordinator.heartbeat import PeerWatch

    for mode in ("abort", "continue"):
        clock = FakeClock()
        cluster = Cluster(tmp_path / mode, "r1", rank=1)
        watch = PeerWatch(cluster, [0, 1], dead_after_s=30, mode=mode)
        watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
        beat(cluster, 0, 1)
        assert watch() is None
        beat(cluster, 0, 2)
        assert watch() is None
        clock.now += 31  # the master fell silent
        ended = watch()
        assert ended is not None and ended.exit_code == 3, mode
        cluster.finish(FinishRecord("the master (rank 0) ran the run's last step and exited", "h", 8))
        ended = watch()
        assert ended is not None and ended.exit_code == 6, mode
        assert str(ended) == "the run finished: the master (rank 0) ran the run's last step and exited"


def test_a_beat_never_waits_for_the_disk(tmp_path: Path, monkeypatch) -> None:
    """An fsync waits for the writeback of other processes' data (up to 26 s under memory pressure here): a beat
    is written atomically without one."""
    import os

    def fsync(fd: int) -> None:
        raise AssertionError("a heartbeat fsynced")

    monkeypatch.setattr(os, "fsync", fsync)
    cluster = Cluster(tmp_path, "r1")
    beat(cluster, 1, 5)
    assert read_beats(cluster) == {1: Beat(5, 0.0, "h", 7)}


def _evicted_after(watch, cluster: Cluster, clock: FakeClock, rank: int, limit_s: float) -> float | None:
    """Poll the master's watch once a second of `clock` for up to `limit_s`: the seconds until `rank` was evicted."""
    start = clock.now
    while clock.now - start <= limit_s:
        assert watch() is None
        if cluster.evicted(rank) is not None:
            return clock.now - start
        clock.now += 1
    return None


def test_continue_mode_a_worker_that_dies_within_a_beat_of_joining_is_evicted(tmp_path: Path) -> None:
    """A worker that registered and then beat once (or never) is evicted dead_after_s after the master saw it
    join, plus at most a beat: it need not have been seen beating first (issue 24, bug 2)."""
    from coordinator.cluster import NodeRecord
    from coordinator.heartbeat import PeerWatch

    for beats in (0, 1):
        clock = FakeClock()
        cluster = Cluster(tmp_path / f"beats{beats}", "r1", rank=0)
        watch = PeerWatch(cluster, [0, 1], dead_after_s=30, mode="continue")
        watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
        clock.now += 20  # the worker joins 20 s after the master's heartbeat began watching
        cluster.register(NodeRecord(1, "node1", "a", 101, None, 0.0))
        for seq in range(1, beats + 1):
            beat(cluster, 1, seq)  # its first beat, then it dies
        evicted_s = _evicted_after(watch, cluster, clock, 1, limit_s=3600)
        assert evicted_s is not None, f"beats={beats}: not evicted after 3600 s of silence"
        assert 30 <= evicted_s <= 35, f"beats={beats}: evicted {evicted_s} s after it joined"
        assert cluster.evictions()[1].reason.startswith("dead: no heartbeat change"), beats


def test_continue_mode_a_worker_that_dies_within_a_beat_of_registering_again_is_evicted(tmp_path: Path) -> None:
    """A restarted worker (a new registration) whose heartbeat writes one beat over its predecessor's file and
    dies is evicted dead_after_s (plus at most a beat) after the master saw it register again."""
    from coordinator.cluster import NodeRecord
    from coordinator.heartbeat import PeerWatch

    clock = FakeClock()
    cluster = Cluster(tmp_path, "r1", rank=0)
    cluster.register(NodeRecord(1, "node1", "a", 101, None, 0.0))
    watch = PeerWatch(cluster, [0, 1], dead_after_s=30, mode="continue")
    watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
    for seq in (1, 2, 3):
        beat(cluster, 1, seq)
        assert watch() is None
        clock.now += 5
    assert _evicted_after(watch, cluster, clock, 1, limit_s=60) is not None  # the first incarnation died
    cluster.register(NodeRecord(1, "node1", "a", 202, None, 0.0))  # restarted: registered again
    beat(cluster, 1, 4)  # its heartbeat goes on from the last beat once, then it dies
    evicted_s = _evicted_after(watch, cluster, clock, 1, limit_s=3600)
    assert evicted_s is not None, "the restarted worker was not evicted after 3600 s of silence"
    assert 30 <= evicted_s <= 35, f"evicted {evicted_s} s after it registered again"
    assert cluster.evictions()[1].node_pid == 202


def test_abort_mode_a_rank_that_dies_within_a_beat_of_joining_stops_the_others(tmp_path: Path) -> None:
    """Abort mode: a registered rank whose heartbeat never changed ends the watching node dead_after_s (plus at
    most a beat) after it was seen to register, naming it; a rank not registered yet is left to the barriers."""
    from coordinator.cluster import NodeRecord
    from coordinator.heartbeat import PeerWatch

    clock = FakeClock()
    cluster = Cluster(tmp_path, "r1", rank=0)
    watch = PeerWatch(cluster, [0, 1, 2], dead_after_s=30)
    watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
    clock.now += 40  # neither worker registered yet: still joining, not dead
    assert watch() is None
    cluster.register(NodeRecord(1, "node1", "a", 101, None, 0.0))
    beat(cluster, 1, 1)
    start, ended = clock.now, None
    while ended is None and clock.now - start <= 3600:
        clock.now += 1
        ended = watch()
    assert ended is not None, "nothing ended after 3600 s of silence"
    assert 30 <= clock.now - start <= 35
    assert ended.exit_code == 3 and str(ended).startswith("rank 1: dead: no heartbeat change")


def test_continue_mode_a_worker_restarted_with_the_same_host_and_pid_is_a_new_incarnation(tmp_path: Path) -> None:
    """A container restarted with the same host name and pid (another start time) registers anew: its
    predecessor's failure flag and eviction are not its own, and it is judged afresh (issue 24, bug 5)."""
    from coordinator.cluster import FailureRecord, NodeRecord
    from coordinator.heartbeat import PeerWatch

    clock = FakeClock()
    cluster = Cluster(tmp_path, "r1", rank=0)
    cluster.register(NodeRecord(1, "node1", "a", 1, None, 0.0, started=500))
    watch = PeerWatch(cluster, [0, 1], dead_after_s=30, mode="continue")
    watch.watcher = LivenessWatcher(cluster, watch.ranks, 30, clock=clock)
    cluster.fail(FailureRecord(1, 2, "train_rollout", "rollout exit 1", 1, "node1", 1, started=500))
    assert watch() is None
    eviction = cluster.evictions()[1]
    assert (eviction.node_host, eviction.node_pid, eviction.node_started) == ("node1", 1, 500)
    cluster.register(NodeRecord(1, "node1", "a", 1, None, 0.0, started=900))  # the container restarted
    assert cluster.members(2) == [0, 1]
    assert Cluster(tmp_path, "r1", rank=1, me=("node1", 1, 900)).standing() is None
    for seq in (1, 2, 3):
        beat(cluster, 1, seq)
        assert watch() is None
        clock.now += 5
    assert cluster.evicted(1) is None and cluster.members(2) == [0, 1]
    assert cluster.members(2, planned={1: ("node1", 1, 500)}) == [0]  # a step planned with the old one
    assert cluster.members(2, planned={1: ("node1", 1, 900)}) == [0, 1]
    assert "registered again" in str(Cluster(tmp_path, "r1", rank=1, me=("node1", 1, 500)).standing())


def test_a_worker_s_peer_watch_reads_o_1_files_a_beat_and_the_master_s_o_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's heartbeat watches the master only: the same few files at 8 ranks as at 64."""
    from coordinator.heartbeat import PeerWatch

    def one_beat(ranks: int, rank: int) -> int:
        log = tmp_path / f"n{ranks}"
        run = old_run(log, num_nodes=ranks, rank_weights=[1] * ranks, dead_after_s=30).run_id
        for r in range(ranks):
            beat(Cluster(log, run), r, 1)
        watch = PeerWatch(Cluster(log, run, rank=rank), list(range(ranks)), dead_after_s=30)
        with file_operations(monkeypatch) as calls:
            assert watch() is None
        return len(calls)

    assert one_beat(8, 1) == one_beat(64, 1) <= 8
    assert one_beat(64, 0) > 64 > one_beat(8, 0)


def test_the_master_s_peer_watch_reads_each_rank_s_heartbeat_a_beat_and_lists_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first beat (every registration read), a beat of the master's watch reads each rank's heartbeat
    and lists the failure flags and the evictions: about one call a rank, not six; a flag still ends it."""
    from coordinator.cluster import FailureRecord, NodeRecord
    from coordinator.heartbeat import REGISTRATIONS_EVERY, PeerWatch

    run = old_run(tmp_path, num_nodes=64, rank_weights=[1] * 64, dead_after_s=30).run_id
    cluster = Cluster(tmp_path, run, rank=0)
    for r in range(1, 64):
        cluster.register(NodeRecord(r, f"node{r}", "a", 100 + r, None, 0.0, started=7))
    watch = PeerWatch(cluster, list(range(64)), dead_after_s=30)
    for seq in range(1, REGISTRATIONS_EVERY):
        for r in range(64):
            beat(cluster, r, seq)
        with file_operations(monkeypatch) as calls:
            assert watch() is None
        if seq > 1:
            assert calls.count("read_bytes") == 63 and calls.count("scandir") == 2 and len(calls) <= 63 + 4
    cluster.fail(FailureRecord(5, 3, "rollout", "rollout exit 1", 1, "h", 9))
    ended = watch()
    assert ended is not None and str(ended) == "rank 5: failed in rollout of iteration 3: rollout exit 1"


def test_a_worker_learns_of_a_stop_from_the_masters_word_and_reads_its_own_files_only_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abort mode: while the master beats, a worker's look at each beat reads the master's files alone; the
    master's beat says STOP once stop.json is there, and the worker then reads why."""
    from coordinator.cluster import NodeRecord
    from coordinator.heartbeat import STOP, PeerWatch, worker_look

    run = old_run(tmp_path, num_nodes=2, rank_weights=[1, 1], dead_after_s=30).run_id
    master, worker = Cluster(tmp_path, run, rank=0), Cluster(tmp_path, run, rank=1)
    for rank in (0, 1):
        worker.register(NodeRecord(rank, f"node{rank}", "a", 10 + rank, None, 0.0, started=7))
    peers = PeerWatch(worker, [0, 1], dead_after_s=30)
    for seq in (1, 2):  # the first sights of the master's beat: no change seen yet, full looks
        beat(master, 0, 41 + seq)
        assert worker_look(worker, peers, seq) is None
    beat(master, 0, 44)
    with file_operations(monkeypatch) as calls:
        assert worker_look(worker, peers, 3) is None
    assert calls == ["read_bytes"]  # the master's beat, its word: no file of this rank's own, no flag
    master.request_stop(StopRequest("maintenance", None, "desk", 5))
    ended = run_heartbeat(master, 0, 5.0, lambda seconds: True, host="node0", pid=10)  # one beat of the master's
    assert isinstance(ended, RunStopped) and read_beats(master, [0])[0].word == STOP
    ended = worker_look(worker, peers, 4)
    assert isinstance(ended, RunStopped) and str(ended) == "run stopped: a person on desk asked: maintenance"
