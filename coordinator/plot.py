"""The learning-curve PNG: train and eval success rate per iteration.

    path = save_plot(log_path)     # <log>/plots/success.png, replaced atomically

Points come from the `"kind": "iteration"` records of `<log>/metrics.jsonl`
(coordinator.summary); an iteration without eval has no eval point.
"""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.summary import iteration_records


def save_plot(log_path: Path) -> Path:
    """Draw the curve and write it atomically; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = iteration_records(log_path)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for key, label, marker in (
        ("train_success_rate", "train rollouts", "o"),
        ("eval_success_rate", "held-out eval", "s"),
    ):
        points = [(r["iteration"], 100 * r[key]) for r in records if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=marker, label=label)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"success per iteration ({Path(log_path).name})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    out = Path(log_path) / "plots" / "success.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".success.{os.getpid()}.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    return out


def format_table(log_path: Path) -> str:
    """Success rates per iteration as a text table."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [f"{'iter':>4}  {'policy':>6}  {'train':>7}  {'eval':>7}  {'loss':>7}  {'update':<10}"]
    for r in iteration_records(log_path):
        served = "base" if r.get("served_version") is None else f"v{r['served_version']}"
        loss = "-" if r.get("train_loss") is None else f"{r['train_loss']:.3f}"
        lines.append(
            f"{r['iteration']:>4}  {served:>6}  {pct(r.get('train_success_rate')):>7}  "
            f"{pct(r.get('eval_success_rate')):>7}  {loss:>7}  {r.get('update') or '-':<10}"
        )
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
