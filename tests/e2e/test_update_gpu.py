"""The update phase on a real NVIDIA GPU, as the run loop calls it (`python -m training ... phase=all`).

Marked `gpu`: scripts/test.sh deselects it on a machine without an NVIDIA GPU. On a GPU machine it
trains the default model (or BATON_GPU_TEST_MODEL, a model folder: bench/gpu/check.sh passes a
random-weight model of the same architecture) for two optimizer steps, with DeepSpeed chosen by
`launch.deepspeed=auto` and without it, and checks what a GPU user relies on: it trains on the GPU
in bfloat16 (with DeepSpeed through its torch_autocast), the promoted policy keeps the base model's dtype,
and the trainer's fp32 weights are kept beside it (`fp32/`) for the next update.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO, env_python
from tests.waits import UPDATE_S, run_waiting

pytestmark = pytest.mark.gpu


def tensor_dtypes(folder: Path) -> Counter:
    """How many tensors of each dtype the folder's safetensors files hold (read from their headers)."""
    dtypes: Counter = Counter()
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        dtypes.update(v["dtype"] for k, v in header.items() if k != "__metadata__")
    return dtypes


@pytest.fixture
def gpu_model(request: pytest.FixtureRequest) -> Path:
    given = os.environ.get("BATON_GPU_TEST_MODEL")
    return Path(given) if given else request.getfixturevalue("model_dir")


@pytest.mark.parametrize("deepspeed", ["auto", "none"])
def test_an_update_on_a_gpu_trains_in_bf16_promotes_the_base_dtype_and_keeps_fp32(
    tmp_path: Path, gpu_model: Path, deepspeed
):
    train_py = os.environ.get("BATON_TRAIN_PY") or env_python("train")
    journal = run_waiting(
        [train_py, str(REPO / "bench/gpu/journal.py"), str(gpu_model), str(tmp_path), "32"],
        waiting_for="the GPU test's journal",
        timeout=120,
    )
    assert journal.returncode == 0, journal.stderr
    cmd = [
        train_py, "-m", "training", "--config-name", "update", f"log_path={tmp_path}", "iteration=0",
        f"model_path={gpu_model}", "phase=all", "launch.nnodes=1", "launch.node_rank=0", "launch.master_port=0",
        f"launch.deepspeed={deepspeed}", "algorithm.max_steps=2", "algorithm.per_device_train_batch_size=2",
        "algorithm.gradient_accumulation_steps=1", "algorithm.warmup_steps=0", "algorithm.learning_rate=1e-5",
    ]  # fmt: skip
    update = run_waiting(cmd, waiting_for="a 2-step update on the GPU", timeout=UPDATE_S, cwd=REPO)
    sys.stdout.write(update.stdout[-3000:] + update.stderr[-3000:])
    assert update.returncode == 0, update.stderr[-3000:]

    run_dir = tmp_path / "training" / "iter_0000"
    train_log = (run_dir / "train.log").read_text()
    if deepspeed == "auto":  # ZeRO-1 computes in bf16 through DeepSpeed's torch_autocast on fp32 parameters
        recipe = (run_dir / "train_config.yaml").read_text()
        assert "bf16: false\n" in recipe and "torch_autocast:\n    enabled: true\n    dtype: bfloat16\n" in recipe
    else:
        assert "compute dtype: torch.bfloat16" in train_log
    assert "device: cuda:0" in train_log
    base = tensor_dtypes(gpu_model)
    promoted = tensor_dtypes(tmp_path / "policy" / "current")
    assert set(promoted) == set(base) == {"BF16"}, f"base {dict(base)}, promoted {dict(promoted)}"
    # the trainer's fp32 weights, kept for the next update to train from, with and without DeepSpeed
    assert set(tensor_dtypes(tmp_path / "policy" / "current" / "fp32")) == {"F32"}
