"""Run in the train environment: `python -m training` on a node with 0 or 2 GPUs, in this process; print JSON.

python tests/e2e/update_in_process.py <model_dir> <log_path> <gpus: 0|2> [override ...]

Writes a train journal of iteration 0 (unless the log path has journals) whose token ids are the model's own chat
template's (what vLLM reports).
With 2 GPUs it makes torch answer as it does on a node with 2 GPUs: `device_count()` is 2, and 0 once
CUDA_VISIBLE_DEVICES is "" (torch reads that variable before it initialises CUDA). This machine has no GPU, so
initialising CUDA (`_lazy_init`, `set_device`) is recorded and raises. Then it runs the entry point's `run`, as
`python -m training` does after Hydra, and prints `RESULT {"exit": N, "log": "...", "cuda_initialised": [...],
"visible_after": ...}` (an exception out of `run` is exit 1, as the interpreter makes it).
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import traceback
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from bench.sum_rollout import write_sum_rollout
from rollout_engine.layout import Layout
from training.__main__ import CONFIG_DIR, run
from training.config import register_configs

VISIBLE = "CUDA_VISIBLE_DEVICES"


def write_journal(model: str, log_path: Path, tasks: int = 6) -> None:
    """One success and one failure per task, single-turn, with the ids the model's chat template gives."""
    journal = Layout(log_path).journal("train", 0, 0)
    write_sum_rollout(AutoTokenizer.from_pretrained(model), journal, 0, tasks, 3)


def act_as_two_gpus() -> list[str]:
    """Patch torch.cuda as above; returns the list that collects each attempt to initialise CUDA."""
    initialised: list[str] = []

    def count() -> int:
        return 0 if os.environ.get(VISIBLE) == "" else 2

    def initialise(*args, **kwargs) -> None:
        where = "".join(traceback.format_stack(limit=6)[:-1])
        initialised.append(where)
        raise RuntimeError(f"CUDA initialised in the update's own process:\n{where}")

    torch.cuda.device_count = count
    torch.cuda.is_available = lambda: count() > 0
    torch.cuda._lazy_init = initialise
    torch.cuda.set_device = initialise
    return initialised


def main(model: str, log_path: str, gpus: str, overrides: list[str]) -> None:
    if not (Path(log_path) / "trajectories").exists():
        write_journal(model, Path(log_path))
    initialised = act_as_two_gpus() if gpus == "2" else []
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        given = {override.split("=", 1)[0] for override in overrides}
        defaults = [f"{k}={v}" for k, v in (("iteration", 0), ("model_path", model)) if k not in given]
        cfg = compose("update", overrides=[f"log_path={log_path}", *defaults, *overrides])
    out = io.StringIO()
    logging.getLogger("training").addHandler(logging.StreamHandler(out))
    logging.getLogger("training").setLevel(logging.INFO)
    try:
        code = run(cfg)
    except Exception:  # what the interpreter does with it: print it, exit 1
        out.write(traceback.format_exc())
        code = 1
    result = {
        "exit": code,
        "log": out.getvalue(),
        "cuda_initialised": initialised,
        "visible_after": os.environ.get(VISIBLE),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
