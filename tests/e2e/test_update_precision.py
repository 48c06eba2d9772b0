"""Promotion keeps the base model's dtype and the trainer's fp32 weights, and the next update trains from those
(a real one-step LLaMA-Factory training on the CPU, which trains and saves in fp32; train environment subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import run_train_script
from tests.e2e.test_update_devices import SMALL, prepare

pytestmark = pytest.mark.e2e

#: a train-environment script: does the next update's starting point hold the trainer's fp32 weights exactly,
#: and do they differ from the served bf16 rounding (an update at lr 1e-6 is below bf16's resolution)?
COMPARE = """
import json, sys
from safetensors.torch import load_file
trained, full, served, base = (load_file(p) for p in sys.argv[1:5])
print(json.dumps({
    "full_is_trained": all(full[k].equal(trained[k]) for k in trained),
    "trained_moved": any(not trained[k].equal(base[k].float()) for k in base),
    "served_is_rounding": all(served[k].equal(trained[k].bfloat16()) for k in trained),
    "rounding_loses_the_update": any(not served[k].float().equal(trained[k]) for k in trained),
}))
"""


def header_dtypes(path: Path) -> set[str]:
    """The dtypes a safetensors file's header names."""
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


#: a train-environment script: the first update moved the weights and saved them at full precision (not a bf16
#: rounding: bf16 is fp32 with the low 16 bits cut), and the second started from them. Adam's first step moves a
#: weight by the learning rate (1e-6), far below bf16's resolution, so the served rounding is the base model's
#: weights: an update from there would end at most one step from them; one from the fp32 copy ends at most one
#: step from it, and two from the rounding where both steps went the same way
CHAIN = """
import json, sys
import torch
from safetensors.torch import load_file
base, first, served, second = (load_file(p) for p in sys.argv[1:5])
def gaps(a, b):
    return torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in b])
print(json.dumps({
    "first_moved": gaps(first, base).max().item() > 0,
    "first_full_precision": any(bool((first[k].view(torch.int32) & 0xFFFF).any()) for k in first),
    "served_is_the_base": gaps(served, base).median().item() == 0,
    "second_one_step_from_first": 0 < gaps(second, first).max().item() < 1.5e-6,
    "second_two_steps_from_served": gaps(second, served).max().item() > 1.5e-6,
}))
"""


# ZeRO-2 stands for ZeRO-1 (the GPU default) too: both save through stage_1_and_2. ZeRO-3's fp32 save is
# checked on a GPU by bench/gpu/check.sh (rft_zero3) and costs this 2-core suite 76 s more.
def test_promotion_keeps_fp32_and_the_next_update_a_deepspeed_one_in_bf16_trains_from_it_and_saves_fp32(
    model_dir: Path, tmp_path: Path
) -> None:
    """A one-step update (the CPU's fp32 training) is promoted in the base model's dtype (bf16) with the trainer's
    fp32 weights kept beside it; the next update, the GPU default's path on the CPU (bf16, asked for, under
    DeepSpeed ZeRO-2), trains from those fp32 weights. DeepSpeed's bf16 mode would save bf16 weights; its
    torch_autocast (bf16 matmuls on this CPU, fp32 parameters) saves fp32, so its promotion keeps a
    full-precision copy too. (One training of each kind: the next update's starting point does not depend on
    how the previous one trained; training.precision.)"""
    log_path = tmp_path / "log"
    first = prepare(
        model_dir, log_path, 0, *SMALL[1:], "phase=all", "algorithm.learning_rate=1e-6", "algorithm.max_steps=1"
    )
    assert first["exit"] == 0, first["log"][-4000:]
    version = log_path / "policy" / "v0001"
    assert header_dtypes(model_dir / "model.safetensors") == {"BF16"}
    assert header_dtypes(version / "model.safetensors") == {"BF16"}
    assert json.loads((version / "config.json").read_text())["dtype"] == "bfloat16"
    assert header_dtypes(version / "fp32" / "model.safetensors") == {"F32"}
    record = json.loads((version / "baton_policy.json").read_text())
    assert (record["dtype"], record["full_precision"]) == ("bfloat16", True)
    unreadable = [p for p in version.rglob("*") if p.is_file() and p.stat().st_mode & 0o044 != 0o044]
    assert unreadable == []
    trained = log_path / "training" / "iter_0000" / "output" / "model.safetensors"
    files = [trained, version / "fp32" / "model.safetensors", version / "model.safetensors"]
    out = run_train_script(
        "-c", COMPARE, *map(str, [*files, model_dir / "model.safetensors"]), waiting_for="the weights' comparison"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {
        "full_is_trained": True,
        "trained_moved": True,
        "served_is_rounding": True,
        "rounding_loses_the_update": True,
    }

    ds = ["launch.deepspeed=zero2", "algorithm.bf16=true", "algorithm.learning_rate=1e-6", "algorithm.max_steps=1"]
    second = prepare(model_dir, log_path, 0, *SMALL[1:], *ds, "phase=all", "iteration=1", f"model_path={version}")
    assert second["exit"] == 0, second["log"][-4000:]
    run_dir = log_path / "training" / "iter_0001"
    recipe = (run_dir / "train_config.yaml").read_text()
    assert f"model_name_or_path: {version / 'fp32'}\n" in recipe
    assert "bf16: false\n" in recipe and "torch_autocast:\n    enabled: true\n    dtype: bfloat16\n" in recipe
    assert "bf16:\n    enabled: false\n" in recipe
    assert header_dtypes(run_dir / "output" / "model.safetensors") == {"F32"}  # the trainer saved fp32
    promoted = log_path / "policy" / "v0002"
    assert header_dtypes(promoted / "model.safetensors") == {"BF16"}
    assert header_dtypes(promoted / "fp32" / "model.safetensors") == {"F32"}
    record = json.loads((promoted / "baton_policy.json").read_text())
    assert (record["dtype"], record["full_precision"]) == ("bfloat16", True)
    files = [
        model_dir / "model.safetensors",
        version / "fp32" / "model.safetensors",
        version / "model.safetensors",
        run_dir / "output" / "model.safetensors",
    ]
    out = run_train_script("-c", CHAIN, *map(str, files), waiting_for="the weights' comparison")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {
        "first_moved": True,
        "first_full_precision": True,
        "served_is_the_base": True,
        "second_one_step_from_first": True,
        "second_two_steps_from_served": True,
    }
