"""The dtype of a policy's weights: served in the base model's, trained on from full precision.

    dtype = weights_dtype(model_dir)              # "bfloat16", "float32", ... (safetensors headers; no torch)
    n = parameter_count(model_dir)                # floating weights in those files
    keep_full_precision(staging, "bfloat16")      # staging/fp32/ = the trainer's fp32 files; staging/ cast
    source = training_weights(policy_version)     # policy_version/fp32 when it has one
    promotion_dtype("auto", "bfloat16", "float32")  # "float32": the server computes wider than the base

The trainer keeps and saves fp32 weights (without DeepSpeed, and with DeepSpeed
through its `torch_autocast`: training.recipe.precision), and so does the LoRA
merge, told so: 2.4 times the size of a bf16 base, and a dtype that changes under the server.
So a promoted version is cast to the dtype of the model it was trained from
(the base model's, version after version), unless the server computes in a
wider one (vLLM on a CPU without native bf16: float32), which it then keeps
(`promotion_dtype`; `promotion.dtype` may name another),
and the trainer's own fp32 files are kept, hard-linked, in `v<NNNN>/fp32/`:
an update at the default learning rates (1e-6, 5e-7) moves a weight far less
than bf16's resolution (8 bits of mantissa: about 0.4% of its size), so the
next update must start from those, not from their bf16 rounding
(`training_weights`). vLLM serves `v<NNNN>/` and reads only its top level.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from rollout_engine.files import save_bytes, save_json

FULL_PRECISION = "fp32"
#: safetensors' names of floating dtypes -> torch's, and their widths in bytes
FLOATS = {"F64": ("float64", 8), "F32": ("float32", 4), "BF16": ("bfloat16", 2), "F16": ("float16", 2)}
WIDTH = {name: width for name, width in FLOATS.values()}


def weights_dtype(model_dir: Path) -> str | None:
    """The dtype of most floating tensors in the folder's top-level *.safetensors (None: no readable weights)."""
    counts: dict[str, int] = {}
    for entry in _float_tensors(model_dir):
        name = FLOATS[entry["dtype"]][0]
        counts[name] = counts.get(name, 0) + 1
    return max(counts, key=lambda name: counts[name]) if counts else None


def parameter_count(model_dir: Path) -> int:
    """The number of floating-point weights in the folder's top-level *.safetensors (0: none readable)."""
    return sum(math.prod(entry["shape"]) for entry in _float_tensors(model_dir))


def _float_tensors(model_dir: Path) -> Iterator[dict]:
    """The header entries of the floating tensors in the folder's top-level *.safetensors."""
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            header = _header(path)
        except (OSError, ValueError, struct.error):  # not a safetensors file: nothing to count
            continue
        yield from (entry for entry in header.values() if entry["dtype"] in FLOATS)


def _header(path: Path) -> dict:
    """A safetensors file's tensor table: an 8-byte little-endian length, then that much JSON."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > os.fstat(f.fileno()).st_size - 8:  # not a safetensors file: its first bytes are no length
            raise ValueError(f"{path} has no safetensors header")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def promotion_dtype(setting: str, trained_from: str | None, served: str) -> str | None:
    """The dtype a version is promoted in: `setting` when it names one; for auto, the dtype of the model the
    update trained from, or the server's `served` dtype when that is wider. A CPU without native bf16 runs
    vLLM in float32: bf16 weights there would only round away what the trainer's fp32 ones learned (an
    update at a small step moves most weights by less than bf16's resolution), and a policy gradient's ratio
    would compare the trainer with that rounding instead of with the policy it sampled from. None: no
    weights to read a dtype from (promoted as saved)."""
    if setting != "auto":
        return setting
    if trained_from is not None and WIDTH.get(served, 0) > WIDTH[trained_from]:
        return served
    return trained_from


def training_weights(model: Path) -> Path:
    """The folder an update trains from: a policy version's full-precision copy when it has one."""
    full = model / FULL_PRECISION
    return full if (full / "config.json").is_file() else model


def keep_full_precision(staging: Path, dtype: str) -> bool:
    """Cast the staged weights to `dtype` when they are wider, keeping the originals (hard links to the trainer's
    files) as a complete HF folder in staging/fp32/. Returns whether it cast. Train environment (torch)."""
    current = weights_dtype(staging)
    if current is None or WIDTH[current] <= WIDTH[dtype]:
        return False
    full = staging / FULL_PRECISION
    full.mkdir()
    for path in staging.iterdir():
        if path.is_file():
            full.joinpath(path.name).hardlink_to(path)
    for path in sorted(staging.glob("*.safetensors")):
        _cast_file(path, dtype)  # a new file replaces the link: the trainer's output and fp32/ keep theirs
    _set_config_dtype(staging, dtype)
    return True


def _cast_file(path: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import load_file, save

    target = getattr(torch, dtype)
    tensors = {
        name: tensor.to(target) if tensor.is_floating_point() else tensor for name, tensor in load_file(path).items()
    }
    save_bytes(path, save(tensors, metadata={"format": "pt"}))


def _set_config_dtype(model_dir: Path, dtype: str) -> None:
    """config.json names the new dtype (vLLM's `--dtype auto` and transformers read it); a sharded index's
    total size is the sum of the cast files' tensors."""
    config = json.loads((model_dir / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = dtype
    save_json(model_dir / "config.json", config)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        sizes = [_tensor_bytes(path) for path in model_dir.glob("*.safetensors")]
        data.setdefault("metadata", {})["total_size"] = sum(sizes)
        save_json(index, data)


def _tensor_bytes(path: Path) -> int:
    return sum(end - start for start, end in (entry["data_offsets"] for entry in _header(path).values()))
