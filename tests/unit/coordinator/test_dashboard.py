"""The dashboard from a canned log path: the snapshot, the episode's turns, the page, files only from inside
the log path, and a log path that is empty or half-written."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import groupfile
from coordinator.dashboard.server import DashboardServer, safe_file
from coordinator.dashboard.state import Board
from coordinator.dashboard.svg import Chart, Series, ticks
from coordinator.runview import StallWatch
from rollout_engine.layout import Layout


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trajectory(episode_id: str, success: bool, status: str = "ok", images: list[str] | None = None) -> dict:
    return {
        "schema": "baton.trajectory/1",
        "episode_id": episode_id,
        "task_id": episode_id.split("#")[0],
        "split": "train",
        "iteration": 1,
        "rank": 0,
        "env": "reasoning_gym",
        "family": "chain_sum",
        "status": status,
        "error": None if status == "ok" else "boom",
        "reward": 1.0 if success else 0.0,
        "success": success,
        "turns": [
            {
                "index": 0,
                "messages": [{"role": "user", "content": "What is 3 + 4?"}],
                "response": "<answer>7</answer>" if success else "<b>8</b>",
                "prompt_token_ids": [1, 2, 3],
                "completion_token_ids": [4, 5],
                "action": {"answer": "7" if success else "8"},
                "observation": None,
                "reward": 1.0 if success else 0.0,
                "images": images or [],
            }
        ],
    }


def fake_run(log: Path) -> Path:
    """Iteration 0 done (rollouts, training, iteration record); iteration 1's train rollout half way."""
    it1 = log / "trajectories" / "train" / "iter_0001"
    it1.mkdir(parents=True)
    (it1 / "images" / "rg-1#0").mkdir(parents=True)
    (it1 / "images" / "rg-1#0" / "step_000.png").write_bytes(b"\x89PNG fake")
    rows = [trajectory("rg-1#0", True, images=["images/rg-1#0/step_000.png"]), trajectory("rg-2#0", False)]
    (it1 / "rank_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    it0 = log / "trajectories" / "train" / "iter_0000"
    it0.mkdir(parents=True)
    (it0 / "rank_0.jsonl").write_text(json.dumps(trajectory("rg-9#0", True)) + "\n")
    (it0 / "rank_0.manifest.json").write_text(json.dumps({"planned": 4, "episodes": 1}))
    cells = [
        {"episode_id": "rg-1#0", "state": "done", "step": 1, "success": True, "reward": 1.0},
        {"episode_id": "rg-2#0", "state": "done", "step": 1, "success": False, "reward": 0.0},
        {"episode_id": "rg-3#0", "state": "generating", "step": 0, "success": False, "reward": None},
        {"episode_id": "rg-4#0", "state": "waiting", "step": 0, "success": False, "reward": None},
    ]
    status = {
        "split": "train",
        "iteration": 1,
        "rank": None,
        "planned": 4,
        "skipped_resumed": 0,
        "finished": 2,
        "counts": {"waiting": 1, "generating": 1, "done": 2},
        "successes": 1,
        "failures": {},
        "elapsed_s": 10.0,
        "completion_tokens": 50,
        "truncated_turns": 1,
        "updated_at": 5.0,
        "cells": cells,
    }
    (log / "status.json").write_text(json.dumps(status))
    metrics = [
        {
            "kind": "rollout",
            "split": "train",
            "iteration": 0,
            "rank": 0,
            "success_rate": 0.25,
            "tokens_per_s": 12.0,
            "mean_response_tokens": 30.5,
            "truncated_turn_rate": 0.05,
        },
        {
            "kind": "rollout",
            "split": "test",
            "iteration": 0,
            "rank": 0,
            "success_rate": 0.1,
            "tokens_per_s": 11.0,
            "mean_response_tokens": 28.0,
        },
        {"kind": "training", "iteration": 0, "train_loss": 1.25, "steps": 2},
        {
            "kind": "iteration",
            "iteration": 0,
            "served_version": None,
            "train_success_rate": 0.25,
            "train_episodes": 4,
            "eval_success_rate": 0.1,
            "eval_episodes": 10,
            "train_loss": 1.25,
            "training_steps": 2,
            "update": "promoted v1",
            "phase_s": {"train_rollout": 30.0, "update": 60.0},
        },
    ]
    (log / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    state0, state1 = log / "run" / "state" / "iter_0000", log / "run" / "state" / "iter_0001"
    state0.mkdir(parents=True)
    state1.mkdir(parents=True)
    (state0 / "update.done").write_text("failed (exit 1)\n")
    (state1 / "train_rollout.done").write_text("")  # not yet, but markers are read as they are
    records = {name: groupfile.Record(123, "456") for name in ("rollout-train", "vllm", "watch")}
    Layout(log).groups(0).parent.mkdir(parents=True)
    Layout(log).groups(0).write_bytes(groupfile.encode(records))
    return log


def test_the_warm_trainer_is_a_phase_only_while_it_works_on_a_job(tmp_path: Path) -> None:
    """A single node's trainer runs from the run's start and waits between updates: the rollout beside it is the
    phase; a job handed over and not yet answered is the update (or the update-check)."""
    log = tmp_path / "log"
    layout = Layout(log)
    records = {name: groupfile.Record(123, "456") for name in ("rollout-train", "trainer", "vllm")}
    layout.groups(0).parent.mkdir(parents=True)
    layout.groups(0).write_bytes(groupfile.encode(records))
    trainer = layout.trainer_dir(0)
    trainer.mkdir()

    def phases() -> list[dict[str, object]]:
        return Board(log).snapshot()["run"]["phases"]

    assert phases() == [{"rank": 0, "phase": "rollout-train"}]  # started, never handed a job
    (trainer / "job.json").write_text(json.dumps({"seq": 1, "argv": ["phase=check", "x=1"], "log": "l"}))
    assert phases() == [{"rank": 0, "phase": "rollout-train"}, {"rank": 0, "phase": "update-check"}]
    (trainer / "done.0.json").write_text(json.dumps({"seq": 1, "exit": 0}))
    assert phases() == [{"rank": 0, "phase": "rollout-train"}]
    (trainer / "job.json").write_text(json.dumps({"seq": 2, "argv": ["iteration=1"], "log": "l"}))
    assert phases() == [{"rank": 0, "phase": "rollout-train"}, {"rank": 0, "phase": "update"}]


def test_the_snapshot_shows_the_live_rollout_its_grid_the_table_curves_and_trouble(tmp_path: Path) -> None:
    snap = Board(fake_run(tmp_path)).snapshot()
    assert snap["run"]["iteration"] == 1
    assert snap["run"]["phases"] == [{"rank": 0, "phase": "rollout-train"}]  # helpers (vllm, watch) are no phase
    (rollout,) = snap["rollouts"]
    assert (rollout["planned"], rollout["finished"], rollout["tokens_per_s"], rollout["eta_s"]) == (4, 2, 5.0, 10.0)
    assert rollout["truncated_turns"] == 1
    grid = snap["grid"]
    assert (grid["split"], grid["iteration"]) == ("train", 1)
    assert grid["choices"] == [{"split": "train", "iteration": 0}, {"split": "train", "iteration": 1}]
    (rank,) = grid["ranks"]
    assert rank["live"] and rank["planned"] == 4
    assert [c["state"] for c in rank["cells"]] == ["done", "done", "generating", "waiting"]
    assert [r["iteration"] for r in snap["iterations"]] == [0]
    titles = [c["title"] for c in snap["charts"]]
    assert titles[0] == "success rate (%)" and "seconds per phase" in titles
    assert "replies cut at the token limit (% of turns)" in titles
    # one iteration so far: each split's success rate is one point, drawn as a dot (svg.py) with its value
    dots = re.findall(r"<title>([^<]*)</title></circle>", snap["charts"][0]["svg"])
    assert dots == ["train: 0, 25", "held-out: 0, 10"]
    (trouble,) = snap["troubles"]
    assert trouble["what"] == "iteration 0's update failed (exit 1)" and "update.log" in trouble["fix"]
    json.dumps(snap)  # all of it is JSON


def test_an_earlier_rollout_is_drawn_from_its_journal_and_manifest(tmp_path: Path) -> None:
    grid = Board(fake_run(tmp_path)).snapshot(("train", 0))["grid"]
    (rank,) = grid["ranks"]
    assert not rank["live"] and rank["planned"] == 4  # the manifest's, not the one line journaled
    assert rank["cells"] == [
        {"episode_id": "rg-9#0", "state": "done", "step": 1, "success": True, "reward": 1.0, "status": "ok"}
    ]


def test_an_episode_has_its_turns_without_token_ids_and_images_relative_to_the_log_path(tmp_path: Path) -> None:
    board = Board(fake_run(tmp_path))
    episode = board.episode("train", 1, "rg-1#0")
    (turn,) = episode["turns"]
    assert turn["response"] == "<answer>7</answer>" and turn["action"] == {"answer": "7"}
    assert "prompt_token_ids" not in turn
    assert turn["images"] == ["trajectories/train/iter_0001/images/rg-1#0/step_000.png"]
    assert safe_file(tmp_path, turn["images"][0]) is not None
    assert board.episode("train", 1, "rg-3#0") is None  # still running: not journaled


def test_a_stalled_rank_is_trouble_with_what_to_do(tmp_path: Path) -> None:
    clock = Clock()
    board = Board(fake_run(tmp_path), StallWatch(clock=clock), clock=clock)
    board.snapshot()
    clock.now = 61.0
    troubles = board.snapshot()["troubles"]
    assert any("has not updated its status for 61s" in t["what"] and "stopped, hung" in t["fix"] for t in troubles)


def test_an_empty_or_missing_log_path_gives_an_empty_snapshot(tmp_path: Path) -> None:
    for log in (tmp_path / "missing", tmp_path):
        snap = Board(log).snapshot()
        assert snap["rollouts"] == [] and snap["grid"]["ranks"] == [] and snap["iterations"] == []
        assert snap["run"]["iteration"] is None and snap["troubles"] == []
        assert all("no data yet" in c["svg"] for c in snap["charts"])


def test_a_run_before_its_first_rollout_and_a_torn_status_file(tmp_path: Path) -> None:
    (tmp_path / "run" / "state" / "iter_0000").mkdir(parents=True)
    (tmp_path / "status.json").write_text('{"split": "tr')  # being replaced
    (tmp_path / "metrics.jsonl").write_text('{"kind": "rollout", "split"\n')
    snap = Board(tmp_path).snapshot()
    assert snap["run"]["iteration"] == 0 and snap["rollouts"] == [] and snap["grid"]["ranks"] == []


def test_safe_file_refuses_paths_outside_the_log_path(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    (log / "a.png").write_bytes(b"x")
    (tmp_path / "secret").write_text("no")
    (log / "out").symlink_to(tmp_path / "secret")
    assert safe_file(log, "a.png") == (log / "a.png").resolve()
    for bad in ("../secret", "%2e%2e/secret", "/etc/passwd", "out", "", "a.png\0", ".", "sub/../../secret"):
        assert safe_file(log, bad) is None, bad


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    log = fake_run(tmp_path / "log")
    (tmp_path / "secret").write_text("no")
    server = DashboardServer(("127.0.0.1", 0), Board(log))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read(), reply.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["Content-Type"]


def test_the_server_answers_the_page_the_state_an_episode_and_files_inside_only(served: str) -> None:
    status, body, kind = get(served + "/")
    assert status == 200 and kind.startswith("text/html") and b"/api/state" in body
    assert b"http://" not in body.replace(b'xmlns="http://www.w3.org/2000/svg"', b"")  # nothing fetched from outside
    status, body, _ = get(served + "/api/state?split=train&iteration=0")
    assert status == 200 and json.loads(body)["grid"]["iteration"] == 0
    status, body, _ = get(served + "/api/episode?split=train&iteration=1&id=rg-2%230")
    assert status == 200 and json.loads(body)["turns"][0]["response"] == "<b>8</b>"
    assert get(served + "/api/episode?split=train&iteration=1&id=nope")[0] == 404
    status, body, kind = get(served + "/files/trajectories/train/iter_0001/images/rg-1%230/step_000.png")
    assert (status, body, kind) == (200, b"\x89PNG fake", "image/png")
    for bad in ("/files/../secret", "/files/%2e%2e/secret", "/files/..%2fsecret", "/files//etc/passwd", "/nope"):
        assert get(served + bad)[0] == 404, bad


def test_ticks_and_a_chart_with_one_point() -> None:
    assert ticks(0, 100) == [0, 25, 50, 75, 100]
    assert ticks(0, 3, integer=True) == [0, 1, 2, 3]
    svg = Chart("t <x>", [Series("a&b", [(2, 5.0)])]).svg()
    assert "t &lt;x&gt;" in svg and "a&amp;b" in svg and "<circle" in svg


def test_axis_labels_tell_close_ticks_apart() -> None:
    """Losses that differ in the third decimal: every y tick its own label, as many decimals as the step needs."""
    svg = Chart("loss", [Series("train", [(1, 2.4151), (2, 2.4249)])]).svg()
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', svg)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert labels == ["2.415", "2.420", "2.425"]
    plain = Chart("success", [Series("train", [(1, 10.0), (2, 90.0)])], y_min=0, y_max=100).svg()
    assert re.findall(r'text-anchor="end">([^<]*)</text>', plain) == ["0", "25", "50", "75", "100"]


def test_the_run_shows_what_a_marker_says_not_the_time_it_was_written(tmp_path: Path) -> None:
    from coordinator.dashboard.state import markers

    state = tmp_path / "run" / "state" / "iter_0003"
    state.mkdir(parents=True)
    (state / "train_rollout.done").write_text("1795503157\n")
    (state / "update.done").write_text("promoted v3\n")
    assert markers(tmp_path, 3) == {"train_rollout": "", "update": "promoted v3"}
