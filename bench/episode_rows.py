"""One row per episode against one row per turn: tokens an update processes and its training time, side by side.

    python -m bench.episode_rows --log L --model M [--iteration 0] [-- extra update overrides]

On a copy of the log path's journals (a real multi-turn rollout: TextWorld, MiniWoB++), runs the update phase
(`python -m training`, train environment) twice, `data.episode_rows=per_turn` then `data.episode_rows=auto`,
the same selection, recipe and seed otherwise, and prints one JSON line per mode: the rows, the tokens the
trainer processes (each row's sequence: its last turn's prompt and reply ids, from `train.token_ids.jsonl`),
the replies trained (equal in both modes), the trainer's runtime (`train_runtime_s`) and the update's wall
time. Record the figures with `lscpu`'s model name and flags (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.server import env_python
from rollout_engine.layout import Layout
from training.dataset import load_token_ids, sampled_turns

REPO = Path(__file__).resolve().parent.parent


def processed(data: Path) -> tuple[int, int, int]:
    """(rows, tokens processed, replies trained) of a prepared dataset folder."""
    rows = load_token_ids(data, "train")
    tokens = replies = 0
    for row in rows:
        turns = sampled_turns(row)
        last = turns[-1]
        tokens += len(last.prompt_token_ids or []) + len(last.completion_token_ids or [])
        replies += len(turns)
    return len(rows), tokens, replies


def copy_journals(source: Path, log: Path, episodes: int, relabel: str) -> None:
    """The log path's train journals into `log`: all of them, or each journal's first `episodes`; `relabel`
    successes: every episode of the copy a success (reward 1), so that rft trains every turn of it; alternate:
    every other episode a success, so that every task's group of samples differs and grpo trains every episode.
    The cost of training an episode does not depend on its label: that is what this benchmark measures when the
    policy solves none (a base model on TextWorld or MiniWoB++), never what it learns."""
    shutil.copytree(Layout(source).trajectories("train"), Layout(log).trajectories("train"))
    for journal in sorted(Layout(log).trajectories("train").glob("*/*.jsonl")):
        rows = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
        rows = rows[:episodes] if episodes > 0 else rows
        for index, row in enumerate(rows if relabel else []):
            won = relabel == "successes" or index % 2 == 0
            row["success"], row["reward"] = won, float(won)
        journal.write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_mode(
    source: Path, model: str, iteration: int, mode: str, extra: list[str], episodes: int = 0, relabel: str = ""
) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"baton-episode-rows-{mode}-") as tmp:
        log = Path(tmp) / "log"
        copy_journals(source, log, episodes, relabel)
        cmd = [env_python("train"), "-m", "training", "--config-name", "update", f"log_path={log}"]
        cmd += [f"iteration={iteration}", f"model_path={model}", f"data.episode_rows={mode}", *extra]
        started = time.monotonic()
        out = subprocess.run(
            cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=False
        )
        wall = time.monotonic() - started
        if out.returncode != 0:
            sys.exit(f"{mode}: the update failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
        run_dir = Layout(log).training_dir(iteration)
        rows, tokens, replies = processed(run_dir / "data")
        records = [json.loads(x) for x in (log / "metrics" / "update.jsonl").read_text().splitlines()]
        training = next(r for r in records if r.get("kind") == "training")
        selection = json.loads((run_dir / "selection.json").read_text())
        return {
            "mode": mode,
            "rows": rows,
            "tokens_processed": tokens,
            "replies_trained": replies,
            "episode_rows": selection["rows"]["episode_rows"],
            "per_turn_reasons": selection["rows"]["per_turn"],
            "steps": training.get("steps"),
            "train_runtime_s": training.get("train_runtime_s"),
            "update_wall_s": round(wall, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="a log path holding trajectories/train/iter_<N>")
    parser.add_argument("--model", required=True)
    parser.add_argument("--iteration", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=0, help="each journal's first N episodes (0: all)")
    parser.add_argument(
        "--relabel",
        choices=("", "successes", "alternate"),
        default="",
        help="the copy's rewards: every episode a success, or every other one (a cost measurement: copy_journals)",
    )
    parser.add_argument("extra", nargs="*", help="update overrides (after --), e.g. algorithm=grpo")
    args = parser.parse_args(argv)
    for mode in ("per_turn", "auto"):
        got = run_mode(args.log, args.model, args.iteration, mode, args.extra, args.episodes, args.relabel)
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
