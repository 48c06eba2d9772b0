"""One GPU-check case's figures as one JSON line: what a run of `python -m training` left in its log path.

usage: python inspect_run.py CASE LOG_PATH ITERATION RC WALL_S MEMORY_TSV
Reads the promoted policy (dtypes of its tensors, sizes, file modes), the trainer's own
runtime and step count, the compute dtype and gradient-checkpointing lines of train.log,
and each GPU process's peak memory from gpu_memory.py's samples of this case.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections import Counter
from pathlib import Path


def tensor_dtypes(folder: Path) -> dict:
    dtypes: Counter = Counter()
    size = 0
    modes = set()
    for f in sorted(folder.glob("*.safetensors")):
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        dtypes.update(v["dtype"] for k, v in header.items() if k != "__metadata__")
        size += f.stat().st_size
        modes.add(oct(f.stat().st_mode & 0o777))
    return {"dtypes": dict(dtypes), "MB": round(size / 1e6), "modes": sorted(modes)}


def trainer_figures(run_dir: Path) -> dict:
    for name in ("all_results.json", "train_results.json"):
        for f in run_dir.glob(f"output/**/{name}"):
            results = json.loads(f.read_text())
            return {"train_runtime_s": results.get("train_runtime"), "train_loss": results.get("train_loss")}
    return {}


def log_lines(train_log: Path) -> dict:
    """LLaMA-Factory's compute dtype, unless the recipe's DeepSpeed config computes through its own
    torch_autocast (then LLaMA-Factory's `bf16` is off and it logs `compute dtype: None`)."""
    text = train_log.read_text(errors="replace") if train_log.exists() else ""
    dtype = re.search(r"compute dtype: ([\w.]+)", text)
    recipe = train_log.with_name("train_config.yaml")
    autocast = re.search(
        r"^  torch_autocast:\n    enabled: true\n    dtype: (\w+)$",
        recipe.read_text(errors="replace") if recipe.exists() else "",
        re.M,
    )
    compute = dtype.group(1) if dtype else None
    if autocast:
        compute = f"torch.{autocast.group(1)} (DeepSpeed autocast)"
    return {
        "compute_dtype": compute,
        "gradient_checkpointing": "Gradient checkpointing enabled" in text,
        "nccl": "nccl" in text.lower(),
    }


def gpu_memory(case: str, samples: Path) -> dict:
    """Peak MiB per process of this case (its log path is on every command line it runs)."""
    peaks: dict[str, float] = {}
    if samples.exists():
        for line in samples.read_text(errors="replace").splitlines():
            _, pid, mib, cmd = (line.split("\t", 3) + [""] * 4)[:4]
            if f"/runs/{case}/" not in cmd and not cmd.rstrip().endswith(f"/runs/{case}"):
                continue
            # the trainer's command names its train_config.yaml, the LoRA merge its merge_config.yaml
            kind = "trainer" if "train_config" in cmd else "merge" if "merge_config" in cmd else "update process"
            key = f"{kind}:{pid}"
            peaks[key] = max(peaks.get(key, 0.0), float(mib))
    return peaks


def main(case: str, log_path: Path, iteration: int, rc: int, wall_s: float, samples: Path) -> None:
    run_dir = log_path / "training" / f"iter_{iteration:04d}"
    current = log_path / "policy" / "current"
    figures = {"case": case, "rc": rc, "wall_s": round(wall_s, 1), "promoted": None}
    if current.exists():
        figures["promoted"] = current.resolve().name
        figures["policy"] = tensor_dtypes(current)
        cfg = current / "config.json"
        if cfg.exists():
            data = json.loads(cfg.read_text())
            figures["policy"]["config_dtype"] = data.get("dtype", data.get("torch_dtype"))
    full = current / "fp32"  # the trainer's fp32 weights the next update starts from (docs/formats.md)
    if full.is_dir():
        figures["full_precision_copy"] = tensor_dtypes(full)
    figures |= trainer_figures(run_dir) | log_lines(run_dir / "train.log")
    figures["gpu_mib_peak"] = gpu_memory(case, samples)
    print(json.dumps(figures))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], Path(a[1]), int(a[2]), int(a[3]), float(a[4]), Path(a[5]))
