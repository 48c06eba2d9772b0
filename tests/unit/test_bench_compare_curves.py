"""bench/compare_curves.py: the markdown table and the PNG of several learning-curve runs."""

from __future__ import annotations

from pathlib import Path

from bench.compare_curves import markdown_table, save_comparison

RECORDS = [
    {
        "iteration": 1,
        "served_version": None,
        "train_success_rate": 0.096,
        "eval_success_rate": 0.0875,
        "train_mean_response_tokens": 27.04,
        "eval_mean_response_tokens": 22.4,
        "train_invalid_action_rate": 0.119,
        "eval_invalid_action_rate": 0.0,
        "update": "promoted v1",
    },
    {"iteration": 2, "served_version": 1, "train_success_rate": 0.135},
]


def test_one_markdown_row_per_iteration() -> None:
    lines = markdown_table(RECORDS).splitlines()
    assert lines[0].startswith("| iteration | served policy | train success | held-out success | reply tokens train")
    assert lines[2] == "| 1 | base | 9.6 % | 8.8 % | 27.0 | 22.4 | 11.9 % | 0.0 % | promoted v1 |"
    assert lines[3] == "| 2 | v1 | 13.5 % | - | - | - | - | - | - |"


def test_the_comparison_plot_is_a_png(tmp_path: Path) -> None:
    out = tmp_path / "img" / "cmp.png"
    save_comparison({"off": RECORDS, "on": RECORDS[:1]}, out)
    assert out.read_bytes()[:4] == b"\x89PNG"
