"""training/space.py and the update around it: an update refuses to start a training whose weights would not fit
on the log path's filesystem, and a failed training says the last error it logged and whether the disk is full."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.training.test_config import load
from training import update
from training.launch import TrainResult
from training.precision import parameter_count
from training.space import BYTES_PER_WEIGHT, OPTIMIZER_BYTES_PER_WEIGHT, Room, free_bytes
from training.update import RunPaths, TrainingError, in_process, last_error


def model_with(folder: Path, **shapes: list[int]) -> Path:
    """A model folder whose safetensors header declares these tensors (parameter_count reads only the header)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()}
    table["step"] = {"dtype": "I64", "shape": [1000], "data_offsets": [0, 0]}  # not a weight
    header = json.dumps({"__metadata__": {"format": "pt"}, **table}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (folder / "config.json").write_text("{}")
    return folder


def test_parameter_count_sums_the_floating_tensors_of_every_file(tmp_path: Path) -> None:
    model = model_with(tmp_path / "m", embed=[100, 8], norm=[8])
    (model / "notes.safetensors").write_text("not a safetensors file")
    assert parameter_count(model) == 808
    assert parameter_count(tmp_path / "absent") == 0


def test_room_counts_the_fp32_output_the_served_copy_and_the_moments_when_they_carry(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    assert free is not None and free > 0
    plain = Room.of(tmp_path / "not" / "made" / "yet", 1000, moments=False)
    assert plain is not None and plain.free == pytest.approx(free, rel=0.01) and plain.need == 1000 * BYTES_PER_WEIGHT
    kept = Room.of(tmp_path, 1000, moments=True)
    assert kept is not None and kept.need == 1000 * (BYTES_PER_WEIGHT + OPTIMIZER_BYTES_PER_WEIGHT)
    assert plain.enough and not Room(tmp_path, free=5, need=6).enough


def test_a_filesystem_that_reports_no_size_is_not_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank = os.statvfs_result((4096, 4096, 0, 0, 0, 0, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda _path: blank)
    assert free_bytes(tmp_path) is None and Room.of(tmp_path, 10**12, moments=False) is None


def prepared(cfg) -> RunPaths:
    """The update's folder as phase=prepare leaves it (train() reads only that its YAML exists here)."""
    paths = RunPaths.of(cfg)
    paths.run_dir.mkdir(parents=True)
    paths.recipe.write_text("stage: sft\n")
    return paths


def trains(returncode: int, logged: str):
    """A warm trainer's training (update.InProcess.trainer) that writes `logged` and exits with `returncode`."""
    calls = []

    def trainer(_recipe: Path, node_log: Path, _env: dict) -> TrainResult:
        calls.append(node_log)
        node_log.parent.mkdir(parents=True, exist_ok=True)
        node_log.write_text(logged)
        return TrainResult(returncode=returncode, wall_s=1.0, timed_out=False)

    return trainer, calls


def test_an_update_too_big_for_the_disk_is_refused_before_it_trains(tmp_path: Path) -> None:
    """A model of 10^15 weights (declared in its header) needs 14 PB (6 bytes a weight, 8 more for Adam's moments
    carried to the next update): no filesystem here has that."""
    model = model_with(tmp_path / "model", w=[10**15])
    cfg = load(tmp_path / "log", f"model_path={model}")
    paths = prepared(cfg)
    trainer, calls = trains(0, "")
    with in_process(0, 1, trainer, lambda code: code), pytest.raises(TrainingError) as refused:
        update.train(cfg, paths, update.Device("cpu", 1))
    said = str(refused.value)
    assert f"the filesystem of {paths.run_dir} has" in said and "this update writes about 14000000.00 GB" in said
    assert "free space there, then run the same command again (nothing was trained" in said
    assert calls == []  # the trainer never started


def test_a_failed_training_names_its_last_error_and_a_disk_that_filled_up_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_with(tmp_path / "model", w=[1000])
    cfg = load(tmp_path / "log", f"model_path={model}")
    paths = prepared(cfg)
    cpu = update.Device("cpu", 1)
    logged = "Traceback (most recent call last):\n  ...\n[rank0]: OSError: [Errno 28] No space left on device\n"
    trainer, calls = trains(1, logged)
    with in_process(0, 1, trainer, lambda code: code), pytest.raises(TrainingError) as failed:
        update.train(cfg, paths, cpu)
    assert calls == [paths.train_log]
    assert str(failed.value) == (
        "training exit 1, its last error: OSError: [Errno 28] No space left on device; "
        f"see {paths.train_log}. policy/current is unchanged; run the same command again to retry"
    )

    # the disk had room when the training started and was full when it failed (someone else filled it)
    free = {"bytes": 10**12}
    monkeypatch.setattr("training.space.free_bytes", lambda _folder: free["bytes"])
    fills, _ = trains(1, "")
    with (
        in_process(0, 1, lambda *a: free.update(bytes=1000) or fills(*a), lambda c: c),
        pytest.raises(TrainingError) as failed,
    ):
        update.train(cfg, paths, cpu)
    assert str(failed.value).startswith(
        f"training exit 1; the filesystem of {paths.run_dir} has 0.00 GB free, and this update writes about 0.00 GB "
        "there (the trained weights in fp32, the served copy and the optimizer's moments when they carry): a full "
        "disk stops the training, often before "
        f"it can log why; see {paths.train_log}."
    )


def test_last_error_is_the_last_exception_line_and_none_without_one(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "ValueError: an early one\nstep 3 loss 1.2 (no Error here)\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    assert last_error(log) == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    log.write_text("Converting format of dataset: 100%\n")
    assert last_error(log) is None and last_error(tmp_path / "absent.log") is None


def test_an_update_removes_earlier_trainings_outputs_before_it_judges_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training killed while it saved (the chaos soak's trainer SIGKILL and hang) left its iteration's output:
    736 MB of half-written optimizer state for the default model, never cleared, so on a tight disk every later
    update was refused for space. A promoted iteration's output is hard-linked into its version, so a version
    pruned by promotion.keep_last kept its space. The next update clears both first; the earlier iterations'
    logs, selection and curves stay, and so does every policy's copy."""
    model = model_with(tmp_path / "model", w=[1000])
    log = tmp_path / "log"
    promoted = RunPaths.of(load(log, f"model_path={model}", "iteration=2"))
    promoted.output.mkdir(parents=True)
    (promoted.output / "model.safetensors").write_bytes(b"trained")
    (log / "policy" / "v0001" / "fp32").mkdir(parents=True)
    kept = log / "policy" / "v0001" / "fp32" / "model.safetensors"
    os.link(promoted.output / "model.safetensors", kept)
    killed = RunPaths.of(load(log, f"model_path={model}", "iteration=3"))
    (killed.output / ".optimizer-21947").mkdir(parents=True)
    (killed.output / ".optimizer-21947" / ".tmpAiDMh9").write_bytes(b"\0" * 4096)
    (killed.output / "trainer_log.jsonl").write_text("{}\n")
    killed.train_log.write_text("killed\n")
    (killed.run_dir / "selection.json").write_text("{}")
    (killed.tensorboard / "events").mkdir(parents=True)
    lora = RunPaths.of(load(log, f"model_path={model}", "iteration=4"))
    lora.merged.mkdir(parents=True)
    (lora.merged / "model.safetensors").write_bytes(b"\0" * 4096)

    cfg = load(log, f"model_path={model}", "iteration=5")
    paths = prepared(cfg)
    seen = {}

    def free(_folder: Path) -> int:
        seen.setdefault("leftovers", [p.name for p in (promoted.output, killed.output, lora.merged) if p.exists()])
        return 10**12

    monkeypatch.setattr("training.space.free_bytes", free)
    trainer, calls = trains(0, "")
    monkeypatch.setattr(update, "parse_training", lambda *_a: {})
    with in_process(0, 1, trainer, lambda code: code):
        update.train(cfg, paths, update.Device("cpu", 1))
    assert calls == [paths.train_log] and seen == {"leftovers": []}  # cleared before the disk was judged
    assert killed.train_log.read_text() == "killed\n" and (killed.run_dir / "selection.json").exists()
    assert (killed.tensorboard / "events").is_dir()
    assert kept.read_bytes() == b"trained" and kept.stat().st_nlink == 1  # pruning v0001 now frees it
