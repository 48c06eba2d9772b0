"""Warm start + RL vs a demonstrations-only control on an agent environment: task files, tables and plot.

    PYTHONPATH=. $BATON_APP_PY -m bench.agent_curve tasks --env miniwob-open --out /abs/data/tasks
    PYTHONPATH=. $BATON_APP_PY -m bench.agent_curve report --env miniwob-open L/seed1 L/seed2 --out c.png

`bench/agent_curve.sh` runs both and the arms between them. A bench
(`BENCHES`) names the environment, its MiniWoB++ families and which of them
have demonstrations. `tasks` writes `train.jsonl` (one seed), `demo.jsonl`
(the train tasks the expert demonstrates) and `test.jsonl`: two held-out sets
drawn from two other seeds, task ids `<env>-heldA-...` and `<env>-heldB-...`,
none sharing a page (MiniWoB++) or game (TextWorld) with the train tasks; it
refuses to write if one does. `report` reads each seed folder's arms (rl/,
control/, mixed/: iteration records and held-out journals) and prints, per
evaluated policy, held-out success pooled with a 95 % Wilson interval, each
held-out set's success on its own (the evaluation-noise check), the
invalid-action share and the optimizer steps that led to it; then each arm's
last policy against the warm start, pooled, over the families with and
without demonstrations, and per family. The PNG draws held-out success of
every arm and seed with the interval as a band.
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
from rollout_engine.history import load_trajectories
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics

#: MiniWoB++ families the page solvers cover and a 135M model can read in 5 steps
MINIWOB_FAMILIES = ("click-test", "click-button", "click-tab", "focus-text", "enter-text", "login-user")
#: miniwob-open: demonstrations for three one- or two-step families only; the other seven have none, so
#: what the policy learns there beyond transfer comes from its own rollouts
OPEN_DEMO_FAMILIES = ("click-test", "focus-text", "enter-text")
OPEN_FAMILIES = (
    *OPEN_DEMO_FAMILIES,
    "click-test-2",
    "click-button",
    "click-link",
    "click-tab",
    "focus-text-2",
    "click-option",
    "login-user",
)
TRAIN_SEED, HELD_SEEDS = 11, {"A": 22, "B": 33}


@dataclass
class Sizes:
    """Tasks per split: MiniWoB++ counts pages per family, TextWorld counts games."""

    train: int
    held: int  # per held-out set


@dataclass(frozen=True)
class Bench:
    """One benchmark: the run's environment, its families and which of them have demonstrations."""

    env: str
    sizes: Sizes
    families: tuple[str, ...] = ()  # MiniWoB++ pages; () for TextWorld
    demo_families: tuple[str, ...] | None = None  # None = every family

    def has_demonstrations(self, family: str) -> bool:
        return self.demo_families is None or family in self.demo_families

    @property
    def open_families(self) -> tuple[str, ...]:
        """The families without demonstrations."""
        return tuple(f for f in self.families if not self.has_demonstrations(f))


BENCHES = {
    "miniwob": Bench("miniwob", Sizes(train=30, held=10), MINIWOB_FAMILIES),
    # 10 families x 2 sets x 12 pages = 240 held-out episodes: +-6 points at 50 % (95 %)
    "miniwob-open": Bench("miniwob", Sizes(train=20, held=12), OPEN_FAMILIES, OPEN_DEMO_FAMILIES),
    "textworld": Bench("textworld", Sizes(train=40, held=15)),
}
#: TextWorld games small enough for a 135M model: one room, three objects, one quest step
TEXTWORLD_GAME = {"nb_rooms": 1, "nb_objects": 3, "quest_length": 1}


def _miniwob(families: tuple[str, ...], per_task: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    from rollout_engine.envs.miniwob import build_tasks

    rows = build_tasks(list(families), per_task, seed)
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


def build_split_tasks(name: str, sizes: Sizes | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows) of bench `name`: train from TRAIN_SEED, sets A and B from HELD_SEEDS, disjoint."""
    bench = BENCHES[name]
    sizes = sizes or bench.sizes

    def make(count: int, seed: int, prefix: str) -> list[dict[str, Any]]:
        if bench.env == "miniwob":
            return _miniwob(bench.families, count, seed, prefix)
        return _textworld(count, seed, prefix)

    train = make(sizes.train, TRAIN_SEED, "train")
    held = [row for name, seed in HELD_SEEDS.items() for row in make(sizes.held, seed, f"held{name}")]
    seen = {_identity(row) for row in train}
    shared = [row["task_id"] for row in held if _identity(row) in seen]
    if shared or len({_identity(row) for row in held}) != len(held):
        raise SystemExit(f"held-out tasks repeat a train task or each other: {shared[:5]}; change HELD_SEEDS")
    return train, held


def demonstration_tasks(name: str, train: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The train tasks the expert demonstrates: those of the bench's families with demonstrations."""
    bench = BENCHES[name]
    return [row for row in train if bench.has_demonstrations(str(row.get("family", "")))]


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
    families: dict[str, tuple[int, int]] = field(default_factory=dict)  # family -> (successes, episodes)

    @property
    def rate(self) -> float:
        return sum(self.successes.values()) / max(1, sum(self.episodes.values()))

    def interval(self) -> tuple[float, float]:
        return wilson(sum(self.successes.values()), sum(self.episodes.values()))


def held_out_counts(
    log_path: Path, iteration: int
) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[int, int]]]:
    """(successes, episodes) per held-out set of one iteration's test rollout (as the update reads journals),
    and (successes, episodes) per family."""
    successes: dict[str, int] = {}
    counts: dict[str, int] = {}
    families: dict[str, tuple[int, int]] = {}
    for traj in load_trajectories(log_path, "test", [iteration]):
        name = held_set(traj.task_id) or "-"
        counts[name] = counts.get(name, 0) + 1
        successes[name] = successes.get(name, 0) + bool(traj.success)
        won, seen = families.get(traj.family, (0, 0))
        families[traj.family] = (won + bool(traj.success), seen + 1)
    return successes, counts, families


def evaluations(log_path: Path, arm: str, start_steps: int, start_label: str) -> list[Evaluation]:
    """Every held-out evaluation of one arm, in order; `start_steps` = optimizer steps behind its base. The
    held-out rollout of an iteration that has not finished (an arm still running, or stopped) counts once it
    is complete: its policy is the last one promoted, the steps all of them."""
    out = []
    steps = start_steps
    records = iteration_records(log_path)
    for record in records:
        if record.get("eval_success_rate") is not None:
            served = record.get("served_version")
            label = start_label if served is None else f"{arm} v{served}"
            successes, counts, families = held_out_counts(log_path, record["iteration"])
            invalid = record.get("eval_invalid_action_rate")
            out.append(Evaluation(label, arm, steps, successes, counts, invalid, families))
        steps += int(record.get("training_steps") or 0)
    finished = {record["iteration"] for record in records}
    rollouts = [r for r in load_metrics(log_path) if r.get("kind") == "rollout" and r.get("split") == "test"]
    for rollout in rollouts:
        if rollout["iteration"] in finished or not rollout.get("complete"):
            continue
        version = rollout.get("policy_version")
        label = start_label if not version else f"{arm} v{version}"
        successes, counts, families = held_out_counts(log_path, rollout["iteration"])
        out.append(Evaluation(label, arm, steps, successes, counts, rollout.get("invalid_action_rate"), families))
        finished.add(rollout["iteration"])
    return out


def trained_iterations(log_path: Path) -> int:
    """The iterations of an arm that ran their train rollout (its update trained or was skipped); its final
    held-out evaluation, an iteration without one, does not count. 0 for a log path without records."""
    if not Layout(log_path).metrics.exists():
        return 0
    return sum(1 for record in iteration_records(log_path) if record.get("train_episodes") is not None)


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


#: arms that start from the RL arm's warm start: (log folder, label in tables and plots)
BRANCHES = {
    "rl-disagree": "RL, tasks whose samples disagree",
    "control": "control: demonstrations only",
    "mixed": "mixed: own successes + demonstrations",
    "grpo": "grpo: policy gradient on own episodes",
}
RL_LABEL = "RL on own successes"
#: arms whose lead over the control the comparison states
ARMS_AGAINST_CONTROL = {"RL": RL_LABEL, "rl-disagree": BRANCHES["rl-disagree"], "mixed": BRANCHES["mixed"]}


@dataclass
class SeedRun:
    """The arms of one training seed (a <log>/seed<S> folder): label -> evaluations, the RL arm first."""

    name: str
    arms: dict[str, list[Evaluation]]
    tables: str

    def finals(self) -> list[tuple[str, Evaluation]]:
        """The warm start, then each arm's last evaluated policy (an arm with one after its start)."""
        starts = [("warm start", rows[1]) for rows in self.arms.values() if len(rows) > 1]
        return starts[:1] + [(label, rows[-1]) for label, rows in self.arms.items() if len(rows) > 2]


def read_seed(run: Path) -> SeedRun:
    """The base model and the warm start (run/warm), then every arm from its policy (run/rl, run/control,
    run/mixed) that has a record; each arm's rows begin with the base model's."""
    base = evaluations(run / "warm", "warm", 0, "base model")[:1]
    warm_steps = sum(int(r.get("training_steps") or 0) for r in iteration_records(run / "warm"))
    arms: dict[str, list[Evaluation]] = {}
    tables = f"warm start ({run / 'warm'}): {warm_steps} optimizer steps on demonstrations\n\n{markdown(base)}\n"
    for name, label in {"rl": RL_LABEL, **BRANCHES}.items():
        path = run / name
        if not Layout(path).metrics.exists():
            continue
        rows = evaluations(path, "RL" if name == "rl" else name, warm_steps, f"warm start ({name}'s start)")
        arms[label] = [*base, *rows]
        tables += f"\n{name} arm ({path}):\n\n{markdown(rows)}\n"
    return SeedRun(run.name, arms, tables)


def _rate(won: int, seen: int) -> str:
    low, high = wilson(won, seen)
    return f"**{100 * won / max(1, seen):.1f} %** ({100 * low:.0f}-{100 * high:.0f}), {won}/{seen}"


def pooled(row: Evaluation, families: tuple[str, ...] | None) -> tuple[int, int]:
    """(successes, episodes) of one evaluation over `families` (None = all)."""
    if families is None:
        return sum(row.successes.values()), sum(row.episodes.values())
    pairs = [row.families.get(name, (0, 0)) for name in families]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def comparison(seeds: list[SeedRun], bench: Bench) -> str:
    """Per seed: the warm start and each arm's last evaluation, with each arm's lead over the control."""
    groups: list[tuple[str, tuple[str, ...] | None]] = [("all held-out", None)]
    if bench.demo_families is not None:
        groups.append(("families with demonstrations", bench.demo_families))
        groups.append(("without", bench.open_families))
    head = " | ".join(name for name, _ in groups)
    lines = [f"| seed | policy | optimizer steps | {head} |", "|---|---|---|" + "---|" * len(groups)]
    leads = []
    for seed in seeds:
        for label, row in seed.finals():
            cells = " | ".join(_rate(*pooled(row, fams)) for _, fams in groups)
            lines.append(f"| {seed.name} | {label} | {row.steps} | {cells} |")
        pairs = [(name, label, "control", BRANCHES["control"]) for name, label in ARMS_AGAINST_CONTROL.items()]
        pairs.append(("grpo", BRANCHES["grpo"], "RL", RL_LABEL))  # the policy gradient against rft (issue 43)
        for name, label, against, against_label in pairs:
            rows = seed.arms.get(label, [])
            other = seed.arms.get(against_label, [])
            if len(rows) > 2 and len(other) > 2:
                # at the same optimizer steps: an update with too few rows trains none (run.sh skips it)
                a = rows[-1]
                b = next((r for r in reversed(other[2:]) if r.steps == a.steps), other[-1])
                low, high = a.interval(), b.interval()
                verdict = "apart" if low[0] > high[1] or high[0] > low[1] else "overlap"
                leads.append(
                    f"{seed.name}: {name} {100 * a.rate:.1f} % at {a.steps} steps against {against} "
                    f"{100 * b.rate:.1f} % at {b.steps}: {100 * (a.rate - b.rate):+.1f} points, intervals {verdict}"
                )
    return "\n".join(lines) + ("\n\n" + "\n".join(leads) if leads else "") + "\n"


def family_table(seeds: list[SeedRun], bench: Bench) -> str:
    """Held-out successes per family of the warm start and each arm's last policy (* = with demonstrations)."""
    families = bench.families or tuple(sorted({f for s in seeds for rows in s.arms.values() for f in rows[0].families}))
    names = [f"{f}{'*' if bench.demo_families is not None and f in bench.demo_families else ''}" for f in families]
    lines = [f"| seed | policy | {' | '.join(names)} |", "|---|---|" + "---|" * len(families)]
    for seed in seeds:
        for label, row in seed.finals():
            label = label.split(":")[0]
            cells = " | ".join("{}/{}".format(*row.families.get(f, (0, 0))) for f in families)
            lines.append(f"| {seed.name} | {label} | {cells} |")
    return "\n".join(lines) + "\n"


def save_plot(seeds: list[SeedRun], bench: Bench, out: Path, title: str) -> None:
    """Held-out success per optimizer step: arms by colour, seeds by line style, the 95 % interval as a band;
    a second panel for the families without demonstrations when the bench has some."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    panels: list[tuple[str, tuple[str, ...] | None]] = [("all held-out episodes", None)]
    if bench.demo_families is not None:
        panels.append(("families without demonstrations", bench.open_families))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.4), dpi=100, squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (panel, families) in zip(axes[0], panels, strict=True):
        for seed_index, seed in enumerate(seeds):
            for arm, rows in seed.arms.items():
                xs = [r.steps for r in rows]
                rates = [pooled(r, families) for r in rows]
                bands = [wilson(*pair) for pair in rates]
                colour = f"C{[RL_LABEL, *BRANCHES.values()].index(arm)}"  # one colour an arm, in every seed
                ax.plot(
                    xs,
                    [100 * won / max(1, seen) for won, seen in rates],
                    marker="o",
                    linestyle=styles[seed_index % len(styles)],
                    color=colour,
                    label=f"{arm} ({seed.name})",
                )
                ax.fill_between(xs, [100 * b[0] for b in bands], [100 * b[1] for b in bands], color=colour, alpha=0.1)
        ax.set_xlabel("optimizer steps since the base model")
        ax.set_ylabel("held-out success (%)")
        ax.set_ylim(0, 100)
        ax.set_title(panel, fontsize="medium")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="x-small")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)


def report(runs: list[Path], bench: Bench, out: Path | None, title: str) -> str:
    """Each seed's per-arm tables, the arms' last policies compared (pooled and per family), and the plot."""
    seeds = [read_seed(run) for run in runs]
    text = "".join(f"== {seed.name}\n\n{seed.tables}\n" for seed in seeds)
    text += f"== the last policy of each arm\n\n{comparison(seeds, bench)}\n{family_table(seeds, bench)}"
    if out is not None:
        save_plot(seeds, bench, out, title)
        text += f"\nplot: {out}\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tasks = sub.add_parser("tasks", help="write train.jsonl and test.jsonl (held-out sets A and B)")
    tasks.add_argument("--env", choices=sorted(BENCHES), required=True)
    tasks.add_argument("--out", required=True, help="the tasks folder (D/tasks)")
    done = sub.add_parser("trained", help="print how many iterations an arm's log path has run (bench/agent_curve.sh)")
    done.add_argument("log_path", help="an arm's log path (<log>/seed<S>/rl, ...)")
    rep = sub.add_parser("report", help="each seed's tables, the arms compared, and the plot")
    rep.add_argument("runs", nargs="+", help="seed folders (<log>/seed<S>), each holding rl/ and the arms beside it")
    rep.add_argument("--env", choices=sorted(BENCHES), required=True, help="the bench the runs ran")
    rep.add_argument("--out", default="", help="write the PNG here")
    rep.add_argument("--title", default="warm start, then RL vs demonstrations only")
    args = parser.parse_args()
    if args.command == "tasks":
        train, held = build_split_tasks(args.env)
        demo = demonstration_tasks(args.env, train)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_jsonl(out / "train.jsonl", train)
        save_jsonl(out / "test.jsonl", held)
        save_jsonl(out / "demo.jsonl", demo)
        print(
            f"{out}: {len(train)} train tasks ({len(demo)} with demonstrations: demo.jsonl), "
            f"{len(held)} held-out tasks (sets {', '.join(HELD_SEEDS)})"
        )
    elif args.command == "trained":
        print(trained_iterations(Path(args.log_path)))
    else:
        out = Path(args.out) if args.out else None
        print(report([Path(r) for r in args.runs], BENCHES[args.env], out, args.title), end="")


if __name__ == "__main__":
    main()
