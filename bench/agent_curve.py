"""Warm start + RL vs a demonstrations-only control on an agent environment: task files, table and plot.

    PYTHONPATH=. $BATON_APP_PY -m bench.agent_curve tasks --env miniwob --out /abs/data/tasks
    PYTHONPATH=. $BATON_APP_PY -m bench.agent_curve report --rl L/rl --control L/control [--mixed L/mixed] --out c.png

`bench/agent_curve.sh` runs both and the arms between them. `tasks` writes
`train.jsonl` (one seed) and `test.jsonl`: two held-out sets drawn from two
other seeds, task ids `<env>-heldA-...` and `<env>-heldB-...`, none sharing a
page (MiniWoB++) or game (TextWorld) with the train tasks; it refuses to
write if one does. `report` reads the arms' iteration records
(coordinator.summary) and held-out journals and prints, per evaluated policy,
held-out success pooled with a 95 % Wilson interval, each held-out set's
success on its own (the evaluation-noise check), the invalid-action share and
the optimizer steps that led to it; the PNG draws held-out success of every
arm with the interval as a band.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.summary import iteration_records
from rollout_engine.files import save_jsonl
from training.journal import load_trajectories

#: MiniWoB++ families the page solvers cover and a 135M model can read in 5 steps
MINIWOB_FAMILIES = ("click-test", "click-button", "click-tab", "focus-text", "enter-text", "login-user")
TRAIN_SEED, HELD_SEEDS = 11, {"A": 22, "B": 33}


@dataclass
class Sizes:
    """Tasks per split: MiniWoB++ counts pages per family, TextWorld counts games."""

    train: int
    held: int  # per held-out set


SIZES = {"miniwob": Sizes(train=30, held=10), "textworld": Sizes(train=40, held=15)}
#: TextWorld games small enough for a 135M model: one room, three objects, one quest step
TEXTWORLD_GAME = {"nb_rooms": 1, "nb_objects": 3, "quest_length": 1}


def _miniwob(per_task: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    from rollout_engine.envs.miniwob import build_tasks

    rows = build_tasks(list(MINIWOB_FAMILIES), per_task, seed)
    for row in rows:
        row["task_id"] = row["task_id"].replace("mw-", f"mw-{prefix}-", 1)
    return rows


def _textworld(count: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    from rollout_engine.envs.textworld import build_tasks

    return build_tasks(count, seed, prefix=f"tw-{prefix}", **TEXTWORLD_GAME)


def _identity(row: dict[str, Any]) -> str:
    """What makes two tasks the same episode: the page and its seed, or the game's settings."""
    meta = row["metadata"]
    return json.dumps(meta, sort_keys=True)


def build_split_tasks(env: str, sizes: Sizes | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows): train from TRAIN_SEED, held-out sets A and B from HELD_SEEDS, disjoint."""
    sizes = sizes or SIZES[env]
    make = _miniwob if env == "miniwob" else _textworld
    train = make(sizes.train, TRAIN_SEED, "train")
    held = [row for name, seed in HELD_SEEDS.items() for row in make(sizes.held, seed, f"held{name}")]
    seen = {_identity(row) for row in train}
    shared = [row["task_id"] for row in held if _identity(row) in seen]
    if shared or len({_identity(row) for row in held}) != len(held):
        raise SystemExit(f"held-out tasks repeat a train task or each other: {shared[:5]}; change HELD_SEEDS")
    return train, held


def held_set(task_id: str) -> str:
    """'A' or 'B' for a held-out task id of `build_split_tasks`, '' for any other."""
    for name in HELD_SEEDS:
        if f"-held{name}-" in task_id:
            return name
    return ""


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate, as fractions."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Evaluation:
    """One held-out rollout of one policy."""

    label: str
    arm: str
    steps: int  # optimizer steps since the base model
    successes: dict[str, int] = field(default_factory=dict)  # per held-out set
    episodes: dict[str, int] = field(default_factory=dict)
    invalid: float | None = None

    @property
    def rate(self) -> float:
        return sum(self.successes.values()) / max(1, sum(self.episodes.values()))

    def interval(self) -> tuple[float, float]:
        return wilson(sum(self.successes.values()), sum(self.episodes.values()))


def held_out_counts(log_path: Path, iteration: int) -> tuple[dict[str, int], dict[str, int]]:
    """(successes, episodes) per held-out set of one iteration's test rollout (as the update reads journals)."""
    successes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for traj in load_trajectories(log_path, "test", [iteration]):
        name = held_set(traj.task_id) or "-"
        counts[name] = counts.get(name, 0) + 1
        successes[name] = successes.get(name, 0) + bool(traj.success)
    return successes, counts


def evaluations(log_path: Path, arm: str, start_steps: int, start_label: str) -> list[Evaluation]:
    """Every held-out evaluation of one arm, in order; `start_steps` = optimizer steps behind its base."""
    out = []
    steps = start_steps
    for record in iteration_records(log_path):
        if record.get("eval_success_rate") is not None:
            served = record.get("served_version")
            label = start_label if served is None else f"{arm} v{served}"
            successes, counts = held_out_counts(log_path, record["iteration"])
            out.append(Evaluation(label, arm, steps, successes, counts, record.get("eval_invalid_action_rate")))
        steps += int(record.get("training_steps") or 0)
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def markdown(rows: list[Evaluation]) -> str:
    sets = sorted({name for row in rows for name in row.episodes})
    head = " | ".join(f"held-out {name}" for name in sets)
    lines = [
        f"| policy | optimizer steps | held-out success (95 % interval) | {head} | invalid actions |",
        "|---|---|---|" + "---|" * len(sets) + "---|",
    ]
    for row in rows:
        low, high = row.interval()
        per_set = " | ".join(
            f"{row.successes.get(name, 0)}/{row.episodes.get(name, 0)}" if row.episodes.get(name) else "-"
            for name in sets
        )
        lines.append(
            f"| {row.label} | {row.steps} | **{_pct(row.rate)}** ({100 * low:.0f}-{100 * high:.0f}) | "
            f"{per_set} | {_pct(row.invalid)} |"
        )
    return "\n".join(lines)


def save_plot(arms: dict[str, list[Evaluation]], out: Path, title: str) -> None:
    """Held-out success per optimizer step of each arm, the 95 % interval as a band; invalid share dotted."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for index, (arm, rows) in enumerate(arms.items()):
        colour = f"C{index}"
        xs = [r.steps for r in rows]
        ax.plot(xs, [100 * r.rate for r in rows], "o-", color=colour, label=f"{arm}: held-out success")
        ax.fill_between(
            xs, [100 * r.interval()[0] for r in rows], [100 * r.interval()[1] for r in rows], color=colour, alpha=0.15
        )
        invalid = [(r.steps, 100 * r.invalid) for r in rows if r.invalid is not None]
        ax.plot([p[0] for p in invalid], [p[1] for p in invalid], "x:", color=colour, label=f"{arm}: invalid actions")
    ax.set_xlabel("optimizer steps since the base model")
    ax.set_ylabel("held-out episodes (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)


#: arms that start from the RL arm's warm start: (option and log folder, label in tables and plots)
BRANCHES = {
    "control": "control: demonstrations only",
    "mixed": "mixed: own successes + demonstrations",
}


def report(rl: Path, branches: dict[str, Path], out: Path | None, title: str) -> str:
    """Tables of the RL arm and of each arm branched from its warm start (`BRANCHES` keys), and the plot."""
    rl_rows = evaluations(rl, "RL", 0, "base model")
    if rl_rows and len(rl_rows) > 1:
        rl_rows[1].label = "warm start (RL v1)"
    arms = {"RL on own successes": rl_rows}
    text = f"RL arm ({rl}):\n\n{markdown(rl_rows)}\n"
    warm_steps = rl_rows[1].steps if len(rl_rows) > 1 else 0
    for name, path in branches.items():
        rows = evaluations(path, name, warm_steps, f"warm start ({name}'s start)")
        arms[BRANCHES[name]] = [*rl_rows[:1], *rows]
        text += f"\n{name} arm ({path}):\n\n{markdown(rows)}\n"
    if out is not None:
        save_plot(arms, out, title)
        text += f"\nplot: {out}\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tasks = sub.add_parser("tasks", help="write train.jsonl and test.jsonl (held-out sets A and B)")
    tasks.add_argument("--env", choices=sorted(SIZES), required=True)
    tasks.add_argument("--out", required=True, help="the tasks folder (D/tasks)")
    rep = sub.add_parser("report", help="the table of each arm and the plot")
    rep.add_argument("--rl", required=True, help="log path of the RL arm (warm start as iteration 1)")
    for name, label in BRANCHES.items():
        rep.add_argument(f"--{name}", default="", help=f"log path of the {label} arm")
    rep.add_argument("--out", default="", help="write the PNG here")
    rep.add_argument("--title", default="warm start, then RL vs demonstrations only")
    args = parser.parse_args()
    if args.command == "tasks":
        train, held = build_split_tasks(args.env)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_jsonl(out / "train.jsonl", train)
        save_jsonl(out / "test.jsonl", held)
        print(f"{out}: {len(train)} train tasks, {len(held)} held-out tasks (sets {', '.join(HELD_SEEDS)})")
    else:
        branches = {name: Path(getattr(args, name)) for name in BRANCHES if getattr(args, name)}
        print(report(Path(args.rl), branches, Path(args.out) if args.out else None, args.title), end="")


if __name__ == "__main__":
    main()
