"""Two or more learning-curve runs side by side: a markdown table per run and one PNG.

    PYTHONPATH=. $BATON_APP_PY -m bench.compare_curves off=/abs/lc-off on=/abs/lc-on --out docs/img/length_drift.png

Each argument is LABEL=LOG_PATH of a `bench/learning_curve.sh` run. Per iteration
(the `"kind": "iteration"` records, coordinator.summary): the served policy, train
and held-out success, mean reply tokens and the share of invalid replies
(reasoning-gym: no number) of both splits. The PNG has held-out success, the
invalid shares and reply tokens per iteration, one colour per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from coordinator.summary import iteration_records

HEADER = (
    "| iteration | served policy | train success | held-out success | reply tokens train | "
    "reply tokens held-out | train no answer | held-out no answer | update |\n|---|---|---|---|---|---|---|---|---|"
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown_table(records: list[dict[str, Any]]) -> str:
    """One markdown row per iteration record."""
    lines = [HEADER]
    for r in records:
        served = "base" if r.get("served_version") is None else f"v{r['served_version']}"
        lines.append(
            f"| {r['iteration']} | {served} | {_pct(r.get('train_success_rate'))} | "
            f"{_pct(r.get('eval_success_rate'))} | {_tokens(r.get('train_mean_response_tokens'))} | "
            f"{_tokens(r.get('eval_mean_response_tokens'))} | {_pct(r.get('train_invalid_action_rate'))} | "
            f"{_pct(r.get('eval_invalid_action_rate'))} | "
            f"{r.get('update') or '-'} |"
        )
    return "\n".join(lines)


def _series(records: list[dict[str, Any]], key: str, scale: float) -> tuple[list[int], list[float]]:
    points = [(r["iteration"], scale * r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def save_comparison(runs: dict[str, list[dict[str, Any]]], out: Path) -> None:
    """Held-out success and the invalid shares (top), reply tokens (bottom), one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), dpi=100, sharex=True)
    for index, (label, records) in enumerate(runs.items()):
        colour = f"C{index}"
        top.plot(*_series(records, "eval_success_rate", 100), "s-", color=colour, label=f"{label}: held-out success")
        top.plot(
            *_series(records, "train_invalid_action_rate", 100), "+:", color=colour, label=f"{label}: train no answer"
        )
        top.plot(
            *_series(records, "eval_invalid_action_rate", 100), "x:", color=colour, label=f"{label}: held-out no answer"
        )
        bottom.plot(*_series(records, "train_mean_response_tokens", 1), "o--", color=colour, label=f"{label}: train")
        bottom.plot(*_series(records, "eval_mean_response_tokens", 1), "s-", color=colour, label=f"{label}: held-out")
    top.set_ylabel("held-out episodes (%)")
    top.set_ylim(0, 100)
    bottom.set_ylabel("reply tokens (mean)")
    bottom.set_ylim(0, 1.15 * bottom.get_ylim()[1])
    bottom.set_xlabel("iteration (the policy it serves was trained in the ones before)")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=LOG_PATH")
    parser.add_argument("--out", default="", help="write the PNG here")
    args = parser.parse_args()
    runs = {}
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            parser.error(f"a run is LABEL=LOG_PATH (got {spec!r})")
        runs[label] = iteration_records(Path(path))
    for label, records in runs.items():
        print(f"{label}:\n\n{markdown_table(records)}\n")
    if args.out:
        save_comparison(runs, Path(args.out))
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
