"""TensorBoard and W&B (offline) trackers log metrics.jsonl exactly once, read back with each tool's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from coordinator import trackers as trackers_mod
from coordinator.trackers import (
    NullTracker,
    TensorBoardTracker,
    WandbTracker,
    build_trackers,
    scalars_of,
    track,
)
from tests.unit.coordinator.wandb_records import history

ITERATION_1 = [
    {
        "kind": "rollout",
        "split": "train",
        "iteration": 1,
        "time": 100.0,
        "rank": 0,
        "success_rate": 0.25,
        "ok_episodes": 64,
        "failures": {"timeout": 2},
        "policy_model": "policy",
        "success_rate_by_family": {"a": 0.5},
    },
    {"kind": "rollout", "split": "test", "iteration": 1, "time": 101.0, "success_rate": 0.5, "mean_reward": None},
    {"kind": "training", "iteration": 1, "time": 102.0, "train_loss": 1.5, "steps": 2, "losses": [1.6, 1.4]},
    {"kind": "promotion", "iteration": 1, "time": 103.0, "policy_version": 1},
    {
        "kind": "iteration",
        "iteration": 1,
        "time": 104.0,
        "train_success_rate": 0.25,
        "update": "promoted v1",
        "phase_s": {"train_rollout": 30.0, "update": 12.5},
    },
]
ITERATION_2 = [
    {"kind": "rollout", "split": "train", "iteration": 2, "time": 200.0, "success_rate": 0.5},
    {"kind": "iteration", "iteration": 2, "time": 204.0, "train_success_rate": 0.5, "phase_s": {"update": 11.0}},
]


def append(log: Path, rows: list[dict], tail: str = "") -> None:
    log.mkdir(parents=True, exist_ok=True)
    with open(log / "metrics.jsonl", "a") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows) + tail)


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a log dir, with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's settings, cache and data directories inside the test's folder, never the user's."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_a_record_becomes_scalars_under_its_split_or_kind() -> None:
    assert scalars_of(ITERATION_1[0]) == {
        "train/success_rate": 0.25,
        "train/ok_episodes": 64.0,
        "train/failures/timeout": 2.0,
        "train/success_rate_by_family/a": 0.5,
    }
    assert scalars_of(ITERATION_1[2]) == {"training/train_loss": 1.5, "training/steps": 2.0}
    assert scalars_of(ITERATION_1[4])["iteration/phase_s/update"] == 12.5


def test_tensorboard_logs_each_record_once_across_calls(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, ITERATION_1)
    assert track(log, [TensorBoardTracker(log)]) == 5
    assert track(log, [TensorBoardTracker(log)]) == 0  # nothing new: no new file either
    append(log, ITERATION_2)
    assert track(log, [TensorBoardTracker(log)]) == 2

    scalars = tensorboard_scalars(log / "trackers" / "tensorboard")
    assert scalars["train/success_rate"] == [(1, 0.25), (2, 0.5)]
    assert scalars["test/success_rate"] == [(1, 0.5)]
    assert scalars["training/train_loss"] == [(1, 1.5)]
    assert scalars["promotion/policy_version"] == [(1, 1.0)]
    assert scalars["iteration/phase_s/update"] == [(1, 12.5), (2, 11.0)]
    assert len(list((log / "trackers" / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_a_line_still_being_written_waits_for_the_next_call(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, ITERATION_1[:1], tail='{"kind": "rollout", "split": "test", "iter')
    assert track(log, [TensorBoardTracker(log)]) == 1
    with open(log / "metrics.jsonl", "a") as handle:
        handle.write('ation": 1, "time": 101.0, "success_rate": 0.5}\n')
    assert track(log, [TensorBoardTracker(log)]) == 1
    assert tensorboard_scalars(log / "trackers" / "tensorboard")["test/success_rate"] == [(1, 0.5)]


def test_a_call_that_died_before_its_cursor_is_undone_and_redone(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "log"
    append(log, ITERATION_1)
    track(log, [TensorBoardTracker(log)])
    append(log, ITERATION_2)
    with monkeypatch.context() as patch:  # the events file is written, then the process dies
        patch.setattr(trackers_mod, "save_cursor", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            track(log, [TensorBoardTracker(log)])
    assert len(list((log / "trackers" / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert track(log, [TensorBoardTracker(log)]) == 2  # --resume: the same records again, the torn call's file gone

    scalars = tensorboard_scalars(log / "trackers" / "tensorboard")
    assert scalars["train/success_rate"] == [(1, 0.25), (2, 0.5)]
    assert scalars["iteration/train_success_rate"] == [(1, 0.25), (2, 0.5)]


def test_wandb_offline_runs_share_one_id_and_hold_each_step_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, ITERATION_1)
    assert track(log, [WandbTracker(log, project="test")]) == 5
    append(log, ITERATION_2)
    assert track(log, [WandbTracker(log, project="test")]) == 2  # a later call (--resume): the same run

    run_id = (log / "trackers" / "wandb" / "run_id").read_text().strip()
    runs = sorted((log / "trackers" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    rows = []
    for run_dir in runs:
        found_id, found_rows = history(run_dir)
        assert found_id == run_id
        rows += found_rows
    assert [row["_step"] for row in rows] == [1, 2]
    assert rows[0]["train/success_rate"] == 0.25 and rows[0]["training/train_loss"] == 1.5
    assert rows[0]["iteration/phase_s/update"] == 12.5 and rows[1]["iteration/train_success_rate"] == 0.5


def test_none_logs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log"
    append(log, ITERATION_1)
    chosen = build_trackers({"tensorboard": None, "wandb": None}, log)
    assert [type(t) for t in chosen] == [NullTracker]
    assert track(log, chosen) == 0
    assert not (log / "trackers").exists()


def test_the_composed_tracker_group_builds_each_tracker(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from training.config import register_configs

    register_configs()
    configs = Path(__file__).resolve().parents[3] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = compose("update", overrides=[f"log_path={tmp_path}", "iteration=1", "tracker=[tensorboard,wandb]"])
    chosen = build_trackers(OmegaConf.to_container(cfg.tracker), tmp_path)
    assert [type(t) for t in chosen] == [TensorBoardTracker, WandbTracker]
    assert chosen[1].mode == "offline" and chosen[1].group == tmp_path.name


def test_track_needs_a_run_log_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.__main__ import build_parser
    from coordinator.protocol_cli import dispatch

    assert dispatch(build_parser().parse_args(["track", "--log-path", str(tmp_path)])) == 2
    assert "--log-path has no run/rank_0/resolved.yaml" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
