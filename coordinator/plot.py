"""The learning-curve PNG: success rate and reply length per iteration.

    path = save_plot(log_path)     # <log>/plots/success.png, replaced atomically

Points come from the `"kind": "iteration"` records of `<log>/metrics.jsonl`
(coordinator.summary); an iteration without eval has no eval point. The top
panel has train and held-out success and each split's share of invalid replies
(reasoning-gym: no number), the bottom one the mean reply tokens of each split,
where RFT's length drift shows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coordinator.summary import iteration_records
from rollout_engine.layout import Layout

#: (record key, label, marker, line style, scale) per curve of each panel; train in C0, held-out in C1
SUCCESS_CURVES = (
    ("train_success_rate", "train rollouts", "o", "-", 100.0),
    ("eval_success_rate", "held-out eval", "s", "-", 100.0),
    ("train_invalid_action_rate", "train replies with no answer", "+", ":", 100.0),
    ("eval_invalid_action_rate", "held-out replies with no answer", "x", ":", 100.0),
)
LENGTH_CURVES = (
    ("train_mean_response_tokens", "train rollouts", "o", "-", 1.0),
    ("eval_mean_response_tokens", "held-out eval", "s", "-", 1.0),
)


def _draw(ax: Any, records: list[dict[str, Any]], curves: tuple[tuple[str, str, str, str, float], ...]) -> None:
    """One line per curve over the records that have its key."""
    for key, label, marker, style, scale in curves:
        points = [(r["iteration"], scale * r[key]) for r in records if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs, ys, marker=marker, linestyle=style, label=label, color="C0" if key.startswith("train") else "C1"
            )
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def save_plot(log_path: Path) -> Path:
    """Draw the curves and write them atomically; return the path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = iteration_records(log_path)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), dpi=100, sharex=True, height_ratios=(3, 2))
    _draw(top, records, SUCCESS_CURVES)
    top.set_ylabel("share of episodes (%)")
    top.set_ylim(0, 100)
    top.set_title(f"success and reply length per iteration ({Path(log_path).name})")
    _draw(bottom, records, LENGTH_CURVES)
    bottom.set_ylabel("reply tokens (mean)")
    bottom.set_ylim(0, 1.15 * bottom.get_ylim()[1])  # room above the longest replies
    bottom.set_xlabel("iteration")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    out = Layout(log_path).plot
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".success.{os.getpid()}.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(log_path: Path) -> str:
    """Per iteration: success rates, mean reply tokens and the share of invalid replies (train, held-out), loss,
    update."""
    lines = [
        f"{'iter':>4}  {'policy':>6}  {'train':>7}  {'eval':>7}  {'tok_tr':>6}  {'tok_ev':>6}  "
        f"{'inv_tr':>7}  {'inv_ev':>7}  {'loss':>7}  {'update':<10}"
    ]
    for r in iteration_records(log_path):
        served = "base" if r.get("served_version") is None else f"v{r['served_version']}"
        loss = "-" if r.get("train_loss") is None else f"{r['train_loss']:.3f}"
        lines.append(
            f"{r['iteration']:>4}  {served:>6}  {_pct(r.get('train_success_rate')):>7}  "
            f"{_pct(r.get('eval_success_rate')):>7}  {_tokens(r.get('train_mean_response_tokens')):>6}  "
            f"{_tokens(r.get('eval_mean_response_tokens')):>6}  {_pct(r.get('train_invalid_action_rate')):>7}  "
            f"{_pct(r.get('eval_invalid_action_rate')):>7}  "
            f"{loss:>7}  {r.get('update') or '-':<10}"
        )
    lines.append("tok_tr / tok_ev: mean reply tokens, train / held-out; inv_tr / inv_ev: replies with no valid answer")
    gain = held_out_gain(log_path)
    if gain:
        lines.append(gain)
    return "\n".join(lines)


def held_out_gain(log_path: Path) -> str:
    """One line comparing the first and the last held-out evaluation ("" with fewer than two)."""
    evals = [r for r in iteration_records(log_path) if r.get("eval_success_rate") is not None]
    if len(evals) < 2:
        return ""
    first, last = evals[0], evals[-1]

    def name(r: dict) -> str:
        return "base" if r.get("served_version") is None else f"v{r['served_version']}"

    points = 100 * (last["eval_success_rate"] - first["eval_success_rate"])
    return (
        f"held-out success: {name(first)} {100 * first['eval_success_rate']:.1f}% (iteration {first['iteration']}) -> "
        f"{name(last)} {100 * last['eval_success_rate']:.1f}% (iteration {last['iteration']}): {points:+.1f} points"
    )
