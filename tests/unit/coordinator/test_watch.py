"""run.sh's live view: the run read from the log path (status files, trainer_log.jsonl, heartbeats), trouble
judged on the observer's clock, the plain lines' pace, and the iteration's summary line."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from coordinator.clusterview import TOTALS_S, read_totals
from coordinator.runview import RunView, StallWatch, clock_s
from coordinator.summary import summary_line
from coordinator.watch import (
    RANK_LINES,
    Frame,
    NodeView,
    PlainOutput,
    build_frame,
    build_output,
    duration,
    rollout_line,
)
from tests.unit.coordinator.fakes import file_operations, old_run


def status(log: Path, rank: int | None, **fields) -> None:
    snap = {
        "split": "train",
        "iteration": 2,
        "rank": rank,
        "planned": 10,
        "skipped_resumed": 2,
        "finished": 4,
        "counts": {"waiting": 2, "setup": 0, "generating": 1, "env": 1, "scoring": 0, "done": 3, "failed": 1},
        "successes": 1,
        "failures": {"model_error": 1},
        "elapsed_s": 20.0,
        "completion_tokens": 300,
        "updated_at": 1000.0,
        "cells": [],
    }
    snap.update(fields)
    name = "status.json" if rank is None else f"status.rank_{rank}.json"
    (log / name).write_text(json.dumps(snap))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_rank_line_counts_this_rollouts_episodes_rate_and_eta(tmp_path: Path) -> None:
    status(tmp_path, 1)
    (rollout,) = RunView(tmp_path).rollouts()
    assert (rollout.rank, rollout.todo, rollout.running, rollout.tokens_per_s) == (1, 8, 2, 15.0)
    assert rollout.eta_s == 20.0  # 4 of 8 done in 20 s: 4 more at 5 s each
    assert rollout_line(rollout) == (
        "train rollout rank 1: 4/8 episodes (+2 resumed), 1 successes (25.0 %), 1 failed, 15.0 tok/s, "
        "20s elapsed, ETA 20s"
    )


def test_a_rank_line_counts_replies_cut_at_the_token_limit_once_there_are_any(tmp_path: Path) -> None:
    status(tmp_path, None, truncated_turns=3, failures={})
    (rollout,) = RunView(tmp_path).rollouts()
    assert rollout.truncated_turns == 3
    assert rollout_line(rollout) == (
        "train rollout: 4/8 episodes (+2 resumed), 1 successes (25.0 %), 3 replies cut, 15.0 tok/s, "
        "20s elapsed, ETA 20s"
    )


def test_every_ranks_status_file_is_read_and_only_the_phases_rollouts_are_shown(tmp_path: Path) -> None:
    status(tmp_path, 0)
    status(tmp_path, 1, finished=0, successes=0, failures={})
    status(tmp_path, 2, split="test")  # another phase's file
    (tmp_path / "status.rank_3.json").write_text("{torn")  # being replaced: left out, no error
    frame = build_frame(RunView(tmp_path), StallWatch(), "rollout-train", 2)
    assert [line.split(":")[0] for line in frame.lines] == ["train rollout rank 0", "train rollout rank 1"]
    assert frame.lines[1].endswith("ETA ?")
    status(tmp_path, 0, finished=8)
    assert build_frame(RunView(tmp_path), StallWatch(), "rollout-train", 2).lines[0].endswith("15.0 tok/s, 20s in all")
    assert build_frame(RunView(tmp_path), StallWatch(), "rollout-train", 3).lines == ["train rollout: starting"]


def test_a_ranks_status_file_missing_from_a_cached_listing_is_read_by_name(tmp_path: Path, monkeypatch) -> None:
    """sshfs lists another node's new file up to 20 s late: the view looks up each rank of the run by name."""
    run_record(tmp_path)
    status(tmp_path, 0)
    status(tmp_path, 1)
    listed = Path.glob
    monkeypatch.setattr(
        Path, "glob", lambda self, pattern: [p for p in listed(self, pattern) if "rank_1" not in p.name]
    )
    assert [r.rank for r in RunView(tmp_path).rollouts()] == [0, 1]


def test_training_progress_from_llamafactorys_trainer_log(tmp_path: Path) -> None:
    out = tmp_path / "training" / "iter_0002" / "output"
    out.mkdir(parents=True)
    rows = [
        {"current_steps": 1, "total_steps": 4, "loss": 2.5, "elapsed_time": "0:00:10", "remaining_time": "0:00:30"},
        {"current_steps": 2, "total_steps": 4, "loss": 2.0, "elapsed_time": "0:01:20", "remaining_time": "1:00:05"},
    ]
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"current_st')
    training = RunView(tmp_path).training(2)
    assert training is not None
    assert (training.step, training.total_steps, training.loss, training.losses) == (2, 4, 2.0, [(1, 2.5), (2, 2.0)])
    assert (training.elapsed_s, training.remaining_s) == (80.0, 3605.0)
    frame = build_frame(RunView(tmp_path), StallWatch(), "update", 2)
    assert frame.lines == ["update: step 2/4, loss 2.0000, 1m20s elapsed, ETA 1h00m"]
    rows.append(
        {"current_steps": 4, "total_steps": 4, "loss": 1.0, "elapsed_time": "0:02:00", "remaining_time": "0:00:00"}
    )
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert build_frame(RunView(tmp_path), StallWatch(), "update", 2).lines == [
        "update: step 4/4, loss 1.0000, 2m00s in all"
    ]
    assert build_frame(RunView(tmp_path), StallWatch(), "update", 3).lines == [
        "update: preparing (no training step logged yet)"
    ]


def test_a_silent_status_then_no_finished_episode_are_trouble_on_the_observers_clock(tmp_path: Path) -> None:
    clock = Clock()
    watch = StallWatch(silent_s=60, no_finish_s=300, clock=clock)
    view = RunView(tmp_path)
    status(tmp_path, 0, updated_at=5000.0)  # the writer's clock is far from ours: never compared
    assert watch.observe(view) == []
    clock.now = 59
    assert watch.observe(view) == []
    clock.now = 61
    (trouble,) = watch.observe(view)
    assert trouble.rank == 0 and "has not updated its status for 61s" in trouble.what
    assert "run/rank_0/logs" in trouble.fix
    # it writes again, but nothing finishes for 5 minutes
    for second in range(62, 400, 10):
        clock.now = second
        status(tmp_path, 0, updated_at=5000.0 + second)
        troubles = watch.observe(view)
    assert [t.what for t in troubles] == ["no train episode finished for 6 min (2 running)"]
    assert "vllm.log" in troubles[0].fix
    status(tmp_path, 0, finished=8)  # done: nothing to worry about
    assert watch.observe(view) == []


def run_record(log: Path) -> Path:
    """A two-node run `r1`'s record; its cluster folder."""
    cluster = log / "cluster"
    (cluster / "runs" / "r1" / "heartbeat").mkdir(parents=True)
    master = {"host": "node0", "addr": "10.0.0.1", "pid": 1}
    record = {"run_id": "r1", "created": 0.0, "num_nodes": 2, "rank_weights": [1, 1], "master": master}
    record |= {"torchrun_port": None, "start_iteration": 1, "on_rank_failure": "abort"}
    record |= {"heartbeat_interval_s": 5.0, "dead_after_s": 30.0}
    (cluster / "run.json").write_text(json.dumps(record))
    return cluster


def test_a_heartbeat_that_stops_changing_is_trouble(tmp_path: Path) -> None:
    clock = Clock()
    cluster = run_record(tmp_path)
    beat = cluster / "runs" / "r1" / "heartbeat" / "rank_1"
    beat.write_text("7 1000.0 node1 4242\n")
    watch = StallWatch(beat_s=15, clock=clock)
    assert watch.observe(RunView(tmp_path)) == []
    clock.now = 16
    (trouble,) = watch.observe(RunView(tmp_path))
    assert trouble.rank == 1 and "heartbeat (host node1, pid 4242) has not changed for 16s" in trouble.what
    beat.write_text("8 1005.0 node1 4242\n")
    assert watch.observe(RunView(tmp_path)) == []


def test_plain_lines_come_at_most_every_period_only_when_changed_and_trouble_once() -> None:
    clock, stream = Clock(), io.StringIO()
    out = PlainOutput(stream, every_s=30, clock=clock)
    out.show(Frame(lines=["a 1"]))
    assert stream.getvalue() == ""  # the phase's start line was just printed
    clock.now = 30
    out.show(Frame(lines=["a 1"]))
    clock.now = 31
    out.show(Frame(lines=["a 2"]))  # changed, but within the period
    clock.now = 60
    out.show(Frame(lines=["a 2"]))
    clock.now = 95
    out.show(Frame(lines=["a 2"]))  # unchanged: nothing
    assert stream.getvalue() == "[baton] a 1\n[baton] a 2\n"
    from coordinator.runview import Trouble

    trouble = Trouble(0, "no train episode finished for 5 min (1 running)", "check")
    later = Trouble(0, "no train episode finished for 6 min (1 running)", "check")
    out.show(Frame(lines=["a 2"], troubles=[trouble]))
    out.show(Frame(lines=["a 2"], troubles=[later]))
    assert stream.getvalue().count("trouble") == 1
    out.close(Frame(lines=["a 2"]))  # the final numbers were just shown
    assert stream.getvalue().count("a 2") == 1
    out.close(Frame(lines=["a 3"]))
    assert stream.getvalue().endswith("[baton] a 3\n")


def test_durations_and_llamafactory_clocks() -> None:
    assert [duration(s) for s in (None, 4.4, 65, 3725)] == ["?", "4s", "1m05s", "1h02m"]
    assert [clock_s(t) for t in ("0:00:07", "12:34", "2:00:00", "n/a")] == [7.0, 754.0, 7200.0, None]


def test_the_summary_line_names_success_loss_update_and_phase_times() -> None:
    record = {
        "iteration": 3,
        "served_version": 2,
        "train_success_rate": 0.125,
        "train_episodes": 64,
        "eval_success_rate": None,
        "train_loss": 0.51234,
        "update": "promoted v3",
        "phase_s": {"train_rollout": 61.0, "update": 90.4},
        "train_mean_response_tokens": 24.04,
    }
    assert summary_line(record) == (
        "iteration 3 (served v2): success train 12.5 % (64), held-out -; reply tokens train 24.0, held-out -; "
        "loss 0.5123; update: promoted v3; train_rollout 61s, update 90s"
    )
    record.update(
        eval_success_rate=0.25, eval_episodes=80, eval_mean_response_tokens=31.96, eval_invalid_action_rate=0.1
    )
    record.update(train_invalid_action_rate=0.05)
    assert "(80); reply tokens train 24.0 (5.0 % invalid), held-out 32.0 (10.0 % invalid); loss" in summary_line(record)


def test_on_a_terminal_the_live_block_gives_way_to_the_final_numbers() -> None:
    stream = io.StringIO()
    out = build_output(stream, every_s=30, live=True)
    out.show(Frame(lines=["train rollout: 3/8 episodes"]))
    out.close(Frame(lines=["train rollout: 8/8 episodes"]))
    assert stream.getvalue().endswith("[baton] train rollout: 8/8 episodes\n")


def test_a_rollout_stopped_by_a_dead_policy_server_is_trouble_with_what_run_sh_does(tmp_path: Path) -> None:
    status(tmp_path, None, policy_down="policy server http://127.0.0.1:8999/v1 stopped answering")
    (trouble,) = StallWatch().observe(RunView(tmp_path))
    assert trouble.rank is None and trouble.what.startswith("the policy server stopped answering during its train")
    assert "restarts vLLM" in trouble.fix and "run/rank_0/logs/vllm.log" in trouble.fix
    status(tmp_path, None, policy_down=None)  # the resumed rollout's status: nothing to say
    assert StallWatch().observe(RunView(tmp_path)) == []


def test_several_nodes_the_master_reads_every_rank_a_worker_its_own_and_the_masters_totals(
    tmp_path: Path, monkeypatch
) -> None:
    old_run(tmp_path, num_nodes=3, rank_weights=[1, 1, 1])
    for rank in (0, 1, 2):
        status(tmp_path, rank, finished=rank + 2)
    clock = Clock()
    master = NodeView(tmp_path, "rollout-train", 2, rank=0, clock=clock)
    assert [line.split(":")[0] for line in master.frame().lines] == [f"train rollout rank {r}" for r in (0, 1, 2)]
    found = read_totals(tmp_path)
    assert found is not None and [(t.ranks, t.finished, t.todo) for t in found.rollouts] == [(3, 9, 24)]
    worker = NodeView(tmp_path, "rollout-train", 2, rank=2, clock=clock)
    with file_operations(monkeypatch) as calls:
        lines = worker.frame().lines
    assert lines[0].startswith("train rollout rank 2: 4/8 episodes")
    assert lines[1].startswith("train rollout, 3 ranks: 9/24 episodes, 3 successes")
    assert calls == ["read_bytes", "read_bytes"]  # its own status and the totals, by name: no other rank's file
    # the master's own rank stays live between its looks at every rank; the others' every TOTALS_S
    status(tmp_path, 0, finished=7)
    status(tmp_path, 1, finished=8)
    clock.now += 1
    done = [re.search(r": (\d+)/8 episodes", line).group(1) for line in master.frame().lines]  # type: ignore[union-attr]
    assert done == ["7", "3", "4"]
    clock.now += TOTALS_S
    assert ": 8/8 episodes" in master.frame().lines[1]


def test_beyond_a_screenful_of_ranks_the_master_shows_its_own_line_and_the_totals(tmp_path: Path) -> None:
    old_run(tmp_path, num_nodes=RANK_LINES + 1, rank_weights=[1] * (RANK_LINES + 1))
    for rank in range(RANK_LINES + 1):
        status(tmp_path, rank)
    lines = NodeView(tmp_path, "rollout-train", 2, rank=0).frame().lines
    assert [line.split(":")[0] for line in lines] == ["train rollout rank 0", f"train rollout, {RANK_LINES + 1} ranks"]


def test_when_stopped_every_view_reads_afresh_so_the_last_lines_are_every_ranks_final_numbers(tmp_path: Path) -> None:
    """run.sh stops the view after the barrier: the master's last lines must be every rank's final numbers even
    when a rank finished within TOTALS_S of its last look, a worker's its own and the master's latest totals."""
    old_run(tmp_path, num_nodes=2, rank_weights=[1, 1])
    for rank in (0, 1):
        status(tmp_path, rank, finished=2)
    clock = Clock()
    master = NodeView(tmp_path, "rollout-train", 2, rank=0, clock=clock)
    worker = NodeView(tmp_path, "rollout-train", 2, rank=1, clock=clock)
    master.frame(), worker.frame()
    for rank in (0, 1):
        status(tmp_path, rank, finished=8, counts={"done": 8})
    clock.now += 1
    assert ": 2/8 episodes" in master.frame().lines[1]  # between its looks at every rank
    last = master.final().lines
    assert [": 8/8 episodes" in line for line in last] == [True, True], last
    last = worker.final().lines
    assert last[0].startswith("train rollout rank 1: 8/8 episodes") and "16/16 episodes" in last[1], last
