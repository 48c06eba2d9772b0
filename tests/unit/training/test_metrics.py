"""Loss and throughput parsed from LLaMA-Factory's output (files first, console as fallback)."""

from __future__ import annotations

import json
from pathlib import Path

from training.metrics import parse_training, policy_gradient_stats


def test_reads_trainer_log_and_results(tmp_path: Path) -> None:
    (tmp_path / "trainer_log.jsonl").write_text(
        json.dumps({"current_steps": 1, "total_steps": 2, "loss": 1.5})
        + "\n"
        + json.dumps({"current_steps": 2, "total_steps": 2, "loss": 1.25})
        + "\n"
    )
    (tmp_path / "train_results.json").write_text(
        json.dumps(
            {"train_loss": 1.375, "train_runtime": 10.0, "train_samples_per_second": 0.8, "train_steps_per_second": 0.2}
        )
    )
    stats = parse_training(tmp_path)
    assert stats == {
        "steps": 2,
        "losses": [1.5, 1.25],
        "train_loss": 1.375,
        "train_runtime_s": 10.0,
        "train_samples_per_second": 0.8,
        "train_steps_per_second": 0.2,
    }


def test_falls_back_to_console_lines(tmp_path: Path) -> None:
    console = tmp_path / "train.log"
    console.write_text(
        "noise\n{'loss': 2.0, 'grad_norm': 3.1, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
        "{'train_runtime': 4.5, 'train_samples_per_second': 1.5, 'train_steps_per_second': 0.4, "
        "'train_loss': 2.0, 'epoch': 1.0}\n"
    )
    stats = parse_training(tmp_path / "missing", console)
    assert stats["losses"] == [2.0] and stats["train_runtime_s"] == 4.5 and stats["train_samples_per_second"] == 1.5


def test_policy_gradient_values_are_read_per_logged_step(tmp_path: Path) -> None:
    """grpo's trainer logs its clip shares, ratio and KL beside each loss; the summary entry has none."""
    history = [
        {"step": 1, "loss": 0.25, "pg_clipped_low": 0.0, "pg_clipped_high": 0.1, "pg_ratio": 1.0, "pg_kl": 0.01},
        {"step": 2, "loss": 0.5, "pg_clipped_low": 0.2, "pg_clipped_high": 0.0, "pg_ratio": 0.9, "pg_kl": 0.03},
        {"step": 2, "train_loss": 0.375, "train_runtime": 8.5},
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert policy_gradient_stats(tmp_path) == {
        "clipped_low": [0.0, 0.2],
        "clipped_high": [0.1, 0.0],
        "ratio": [1.0, 0.9],
        "kl": [0.01, 0.03],
    }
    history = [{k: v for k, v in entry.items() if k != "pg_kl"} for entry in history]  # kl_beta 0: no KL logged
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert "kl" not in policy_gradient_stats(tmp_path) and policy_gradient_stats(tmp_path)["ratio"] == [1.0, 0.9]
    assert policy_gradient_stats(tmp_path / "missing") == {}
