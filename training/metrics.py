"""Loss and throughput of one training run, appended to `<log>/metrics/update.jsonl` (rollout_engine.metrics_log).

LLaMA-Factory writes `trainer_log.jsonl` (one line per logging step: loss,
lr, epoch, elapsed) and `train_results.json` (train_runtime,
train_samples_per_second, train_loss, ...) into its output directory;
`parse_training` reads both (and, when they are missing, the HF Trainer's
`{'loss': ...}` lines in the console log). `policy_gradient_stats` reads the
per-step values algorithm=grpo's trainer logs beside the loss (`pg_clipped_low`,
`pg_clipped_high`, `pg_ratio`, `pg_kl`, `pg_tis_weight`, `pg_tis_capped`, and the first step's
`pg_logprob_gap`) from the HF Trainer's `trainer_state.json`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from rollout_engine.files import read_jsonl

_DICT_LINE = re.compile(r"\{'(?:loss|train_runtime)'[^{}]*\}")


def parse_training(output_dir: Path, console_log: Path | None = None) -> dict[str, Any]:
    """The run's per-step losses and its summary."""
    trainer_log = output_dir / "trainer_log.jsonl"
    steps = read_jsonl(trainer_log).rows if trainer_log.exists() else []  # torn lines skipped
    summary = _read_json(output_dir / "train_results.json")
    if (not steps or not summary) and console_log is not None and console_log.exists():
        console_steps, console_summary = _parse_console(console_log.read_text(errors="replace"))
        steps = steps or console_steps
        summary = summary or console_summary
    losses = [s["loss"] for s in steps if isinstance(s.get("loss"), int | float)]
    return {
        "steps": max((int(s.get("current_steps", 0)) for s in steps), default=len(losses)),
        "losses": losses,
        "train_loss": summary.get("train_loss"),
        "train_runtime_s": summary.get("train_runtime"),
        "train_samples_per_second": summary.get("train_samples_per_second"),
        "train_steps_per_second": summary.get("train_steps_per_second"),
    }


#: the values training.pg_trainer logs at each logging step, by their record key
PG_KEYS = {
    "clipped_low": "pg_clipped_low",
    "clipped_high": "pg_clipped_high",
    "ratio": "pg_ratio",
    "kl": "pg_kl",
    "logprob_gap": "pg_logprob_gap",  # the first logged step's only
    "tis_weight": "pg_tis_weight",  # old_logprobs=trainer: the mean importance weight of the sampler's difference
    "tis_capped": "pg_tis_capped",  # and the share of tokens whose weight the cap cut
}


def policy_gradient_stats(output_dir: Path) -> dict[str, list[float]]:
    """Each logged step's policy-gradient values, as lists (a key the run did not log is left out)."""
    history = _read_json(output_dir / "trainer_state.json").get("log_history", [])
    steps = [entry for entry in history if isinstance(entry, dict) and "loss" in entry]
    found = {key: [entry[name] for entry in steps if name in entry] for key, name in PG_KEYS.items()}
    return {key: values for key, values in found.items() if values}


def _parse_console(text: str) -> tuple[list[dict], dict]:
    steps, summary = [], {}
    for match in _DICT_LINE.finditer(text):
        try:
            record = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError):
            continue
        if "train_runtime" in record:
            summary = record
        else:
            steps.append(record)
    return steps, summary


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
