"""The update's fixed cost: fresh processes against the warm trainer, side by side on the same work.

    PYTHONPATH=. $BATON_TRAIN_PY -m bench.update_overhead [--iterations 3] [--tasks 32] [--steps 2] [--keep DIR]
    PYTHONPATH=. $BATON_TRAIN_PY -m bench.update_overhead --loop [--iterations 3] [--steps 1]

For each arm (BATON_WARM_TRAINER=0, then 1) it runs `scripts/run.sh --rl-phase update --max-iterations N`
and hands it the same N train rollouts one by one (one success and one failure per task, token ids from
the default model's chat template), each once the update before it is done. Every update selects, checks
token fidelity, trains `--steps` optimizer steps of a full fine-tune from the last promoted policy, and
promotes. Per update it prints the update phase's wall time (run/state/iter_<n>/times), LLaMA-Factory's
`train_runtime_s` and the rest, the fixed cost: start-up, prepare, the fidelity check, model load, save
and promotion; and the peak RSS of run.sh's process tree (sampled every 0.25 s). No vLLM.
With --loop the arms are `run.sh --rl-phase both` runs of N quickstart-sized iterations instead (24 train
tasks x 4, 8 held-out tasks at iteration 1), with their vLLM: the serve phase after each update (the new policy
reloaded) is printed too, and the peak RSS holds vLLM, the engines and the trainer together.
About 4 minutes per arm on 2 cores at the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import PeakRss, cpu_line
from bench.sum_rollout import write_sum_rollout
from coordinator.runstate import is_done, mark, phase_times
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics

REPO = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"


class Rollouts:
    """Train rollouts of the default model's chat template (what a rollout run leaves for an update run)."""

    def __init__(self, model: Path, tasks: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.tasks = tasks

    def write(self, log: Path, iteration: int) -> None:
        """Iteration `iteration`'s train rollout, finished: a success and a failure per task."""
        write_sum_rollout(self.tokenizer, Layout(log).journal("train", iteration, 0), iteration, self.tasks, iteration)
        mark(log, iteration, "train_rollout", "done")


def run_arm(data: Path, log: Path, warm: bool, rollouts: Rollouts, iterations: int, steps: int) -> tuple[float, int]:
    """run.sh --rl-phase update for `iterations` updates, each rollout written once the update before it is done
    (an update run trains the newest); its wall time and the peak RSS of its process tree."""
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log)]
    cmd += ["--rl-phase", "update", "--max-iterations", str(iterations), "--wait-timeout", "600"]
    cmd += [f"algorithm.max_steps={steps}"]
    cmd += ["algorithm.per_device_train_batch_size=4", "algorithm.gradient_accumulation_steps=1"]
    cmd += ["algorithm.warmup_steps=0", "algorithm.cutoff_len=512"]
    env = {**os.environ, "BATON_WARM_TRAINER": str(int(warm)), "BATON_PROGRESS_S": "0", "BATON_UPDATE_POLL_S": "1"}
    rollouts.write(log, 1)
    began = time.monotonic()
    with open(log.parent / f"{log.name}.out", "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        rss = PeakRss(proc.pid)
        for iteration in range(2, iterations + 1):
            while proc.poll() is None and not is_done(log, iteration - 1, "update"):
                time.sleep(0.2)
            rollouts.write(log, iteration)
        code = proc.wait()
        peak = rss.stop()
    if code != 0:
        sys.exit(f"run.sh failed (exit {code}); see {log.parent / f'{log.name}.out'}")
    return time.monotonic() - began, peak


def run_loop(data: Path, log: Path, warm: bool, iterations: int, steps: int) -> tuple[float, int]:
    """--loop: run.sh --rl-phase both for `iterations` quickstart-sized iterations (its own vLLM); wall time and
    peak RSS of its process tree (vLLM, engines and trainer together)."""
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log)]
    cmd += ["--rl-phase", "both", "--max-iterations", str(iterations), "--eval-interval", "1000"]  # at 1 only
    cmd += ["env_config.train_tasks_rollout_size=24", "env_config.n_samples_per_task=4", "env_config.live_view=off"]
    cmd += ["env_config.test_tasks_rollout_size=8"]
    cmd += [f"algorithm.max_steps={steps}", "algorithm.per_device_train_batch_size=1", "algorithm.num_train_epochs=1"]
    cmd += ["algorithm.gradient_accumulation_steps=1"]  # one success is enough to train: every update trains
    env = {**os.environ, "BATON_WARM_TRAINER": str(int(warm)), "BATON_PROGRESS_S": "0"}
    began = time.monotonic()
    with open(log.parent / f"{log.name}.out", "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        rss = PeakRss(proc.pid)
        code = proc.wait()
        peak = rss.stop()
    if code != 0:
        sys.exit(f"run.sh failed (exit {code}); see {log.parent / f'{log.name}.out'}")
    return time.monotonic() - began, peak


def report(log: Path, iterations: int) -> list[dict]:
    rows = {r["iteration"]: r for r in load_metrics(log) if r.get("kind") == "training"}
    out = []
    for iteration in range(1, iterations + 1):
        if iteration not in rows:  # nothing to train on (printed as such)
            out.append({"iteration": iteration, "update_s": 0.0, "steps_s": 0.0, "fixed_s": 0.0, "serve_s": None})
            continue
        times = phase_times(log, iteration)
        update_s, steps_s = times.get("update", 0.0), rows[iteration]["train_runtime_s"]
        out.append(
            {
                "iteration": iteration,
                "update_s": update_s,
                "steps_s": steps_s,
                "fixed_s": update_s - steps_s,
                "serve_s": times.get("serve"),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=32, help="tasks per rollout (a success and a failure each)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per update")
    parser.add_argument("--arms", default="fresh,warm")
    parser.add_argument("--loop", action="store_true", help="run.sh --rl-phase both with its vLLM (quickstart-sized)")
    parser.add_argument("--keep", metavar="DIR", help="keep the log paths and run.sh outputs under DIR")
    parser.add_argument(
        "--data-path", default=os.environ.get("BATON_DATA", str(Path.home() / ".cache/baton/test-data"))
    )
    args = parser.parse_args()
    data = Path(args.data_path)
    print(f"# {cpu_line()}")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    where = tempfile.TemporaryDirectory(prefix="baton-update-") if not args.keep else None
    rollouts = Rollouts(data / "models" / MODEL, args.tasks)
    with where or contextlib.nullcontext(tempfile.mkdtemp(prefix="baton-update-", dir=args.keep)) as tmp:
        for arm in args.arms.split(","):
            log = Path(tmp) / arm
            if args.loop:
                wall, peak = run_loop(data, log, arm == "warm", args.iterations, args.steps)
            else:
                wall, peak = run_arm(data, log, arm == "warm", rollouts, args.iterations, args.steps)
            rows = report(log, args.iterations)
            parts = ", ".join(
                f"#{r['iteration']} {r['update_s']:.0f} s (steps {r['steps_s']:.1f}, fixed {r['fixed_s']:.1f}"
                + (f", then serve {r['serve_s']:.0f} s)" if r["serve_s"] is not None else ")")
                for r in rows
            )
            later = [r["fixed_s"] for r in rows[1:]]
            after = f"; fixed cost after the first: max {max(later):.1f} s" if later else ""
            print(
                f"{arm:5s}: updates {parts}{after} (run.sh {wall:.0f} s, peak RSS {peak / 2**30:.2f} GiB)", flush=True
            )


if __name__ == "__main__":
    main()
