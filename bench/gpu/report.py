"""The GPU check's table (markdown) from inspect_run.py's JSON lines. usage: python report.py CASES.jsonl"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def dtype_cell(policy: dict | None) -> str:
    if not policy:
        return "-"
    dtypes = "+".join(f"{k}x{v}" for k, v in policy["dtypes"].items())
    return f"{dtypes}, {policy['MB']} MB, {','.join(policy['modes'])}"


def row(c: dict) -> str:
    runtime = c.get("train_runtime_s")
    memory = ", ".join(f"{k.split(':')[0]} {v:.0f}" for k, v in sorted(c.get("gpu_mib_peak", {}).items())) or "-"
    return (
        f"| {c['case']} | {c['rc']} | {c['wall_s']} | {runtime if runtime is not None else '-'} | "
        f"{c.get('compute_dtype') or '-'} | {'on' if c.get('gradient_checkpointing') else 'off'} | "
        f"{c.get('promoted') or '-'} | {dtype_cell(c.get('policy'))} | "
        f"{dtype_cell(c.get('full_precision_copy'))} | {memory} |"
    )


def main(path: Path) -> None:
    print(
        "| case | exit | wall s | trainer's runtime s | compute dtype | grad. ckpt | promoted | served weights "
        "| full-precision copy | GPU MiB peak per process |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in path.read_text().splitlines():
        if line.strip():
            print(row(json.loads(line)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
