"""The update's own process on a GPU node: it parses LLaMA-Factory's YAML as one process and never initialises
CUDA; a setting LLaMA-Factory refuses is bad input (exit 2), not a failed training (train environment subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import train_script_result

# a real LLaMA-Factory and tokenizer on the default model: not a unit test
pytestmark = pytest.mark.e2e

SMALL = ["phase=prepare", "algorithm.per_device_train_batch_size=1", "algorithm.gradient_accumulation_steps=1"]


def prepare(model_dir: Path, log_path: Path, gpus: int, *overrides: str) -> dict:
    """tests/e2e/update_in_process.py's RESULT."""
    return train_script_result(
        "tests/e2e/update_in_process.py", str(model_dir), str(log_path), str(gpus), *overrides,
        waiting_for="the update's prepare in one process",
    )  # fmt: skip


def test_a_node_with_two_gpus_prepares_without_initialising_cuda(model_dir: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "log"
    result = prepare(model_dir, log_path, 2, *SMALL)
    assert result["exit"] == 0, result["log"][-4000:]
    assert result["cuda_initialised"] == []
    assert result["visible_after"] is None  # the process's own CUDA_VISIBLE_DEVICES is as it found it
    assert "token fidelity (train, template smollm2)" in result["log"]
    run_dir = log_path / "training" / "iter_0000"
    recipe = (run_dir / "train_config.yaml").read_text()
    # the trainer's YAML is the GPU one: ZeRO-1, computing in bf16 through DeepSpeed's autocast
    assert "    stage: 1\n" in recipe and "torch_autocast:\n    enabled: true\n" in recipe and "use_cpu" not in recipe
    assert json.loads((run_dir / "selection.json").read_text())["train_rows"] == 6


def test_a_setting_llamafactory_refuses_stops_prepare_with_exit_2(model_dir: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "log"
    # (a pass-through value: the schema checks algorithm.lr_scheduler_type itself before LLaMA-Factory is asked)
    result = prepare(model_dir, log_path, 0, *SMALL, "+algorithm.llamafactory_overrides.lr_scheduler_type=bogus")
    assert result["exit"] == 2, result["log"][-4000:]
    log = result["log"]
    assert (
        "LLaMA-Factory rejects the training YAML of this config: ValueError: bogus is not a valid SchedulerType" in log
    )
    assert "field: algorithm.lr_scheduler_type='bogus'" in log
    assert "fix: set algorithm.lr_scheduler_type to a value LLaMA-Factory accepts" in log
    assert not (log_path / "training" / "iter_0000" / "train_config.yaml").exists()
