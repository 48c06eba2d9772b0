"""A training the trainer stops because it refuses a setting (torch's optimizer on learning_rate=-1, a value
LLaMA-Factory checks only at train time) is bad input: python -m training exits 2, not 1, naming the setting,
its value and the fix, so run.sh does not retry it and ends the run with exit 2 (issue 26). Any other failure
stays exit 1 (a retry may pass)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollout_engine.exits import Exit
from training.__main__ import _run
from training.config import register_configs
from training.launch import TrainResult
from training.recipe import Device
from training.update import RunPaths, refusal

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
#: how torchrun's log shows a worker's refusal (a traceback per rank, then torchrun's own)
REFUSED_LOG = """[INFO] Running training
[rank0]: Traceback (most recent call last):
[rank0]:   File "/env/lib/python3.11/site-packages/torch/optim/adamw.py", line 54, in __init__
[rank0]:     raise ValueError(f"Invalid learning rate: {lr}")
[rank0]: ValueError: Invalid learning rate: -1.0
E1126 04:00:00 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""
RECIPE = "model_name_or_path: /m\nlearning_rate: -1.0\ntemplate: smollm2\nstage: sft\n"


def test_a_refused_setting_is_named_with_its_value_and_fix(tmp_path: Path) -> None:
    (tmp_path / "node.log").write_text(REFUSED_LOG)
    (tmp_path / "train_config.yaml").write_text(RECIPE)
    said = refusal(tmp_path / "node.log", tmp_path / "train_config.yaml")
    assert said is not None
    assert "ValueError: Invalid learning rate: -1.0" in said
    assert "field: algorithm.learning_rate=-1.0" in said and "fix: set algorithm.learning_rate" in said


@pytest.mark.parametrize(
    "log",
    [
        "[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
        "[rank0]: ValueError: too many values to unpack (expected 2)\n",  # names no setting: a bug, not input
        "",
    ],
)
def test_any_other_failure_is_no_refusal(tmp_path: Path, log: str) -> None:
    (tmp_path / "node.log").write_text(log)
    (tmp_path / "train_config.yaml").write_text(RECIPE)
    assert refusal(tmp_path / "node.log", tmp_path / "train_config.yaml") is None
    assert refusal(tmp_path / "absent.log", tmp_path / "train_config.yaml") is None


def run_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str) -> int:
    """python -m training phase=train's exit code when the trainer ends with exit 1 and `log`."""
    (tmp_path / "model").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        dict_cfg = compose(
            "update",
            overrides=[
                f"log_path={tmp_path / 'log'}",
                "iteration=1",
                f"model_path={tmp_path / 'model'}",
                "phase=train",
            ],
        )

    paths = RunPaths.of(OmegaConf.to_object(dict_cfg))
    paths.recipe.parent.mkdir(parents=True)
    paths.recipe.write_text(RECIPE)

    def trainer(_recipe, node_log: Path, *_args) -> TrainResult:
        node_log.parent.mkdir(parents=True, exist_ok=True)
        node_log.write_text(log)
        return TrainResult(returncode=1, timed_out=False, wall_s=0.1)

    monkeypatch.setattr("training.update.run_training", trainer)
    return _run(dict_cfg, Device("cpu", 1))


def test_python_m_training_exits_2_on_a_refusal_and_1_on_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert run_train(tmp_path / "a", monkeypatch, REFUSED_LOG) == Exit.BAD_INPUT
    assert "field: algorithm.learning_rate=-1.0" in caplog.text
    assert run_train(tmp_path / "b", monkeypatch, "[rank0]: RuntimeError: NCCL timeout\n") == Exit.FAILED
