"""The update's fixed cost: fresh processes against the warm trainer, side by side on the same work.

    PYTHONPATH=. $BATON_TRAIN_PY -m bench.update_overhead [--iterations 3] [--tasks 32] [--steps 2] [--keep DIR]

For each arm (BATON_WARM_TRAINER=0, then 1) it writes the same N train rollouts (iterations 1..N, one
success and one failure per task, token ids from the default model's chat template) and runs
`scripts/run.sh --rl-phase update` over them: every update selects, checks token fidelity, trains
`--steps` optimizer steps of a full fine-tune from the last promoted policy, and promotes. Per update it
prints the update phase's wall time (run/state/iter_<n>/times), LLaMA-Factory's `train_runtime_s` and the
rest, the fixed cost: start-up, prepare, the fidelity check, model load, save and promotion. No vLLM.
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

from bench.multinode_overhead import cpu_line
from coordinator.runstate import phase_times
from rollout_engine.metrics_log import load_metrics

REPO = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"


def write_rollouts(model: Path, log: Path, iterations: int, tasks: int) -> None:
    """Iterations 1..N of train rollouts, finished (what a rollout run leaves for an update run)."""
    from transformers import AutoTokenizer

    from rollout_engine.journal import Journal
    from rollout_engine.types import Trajectory, Turn

    tokenizer = AutoTokenizer.from_pretrained(model)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for iteration in range(1, iterations + 1):
        name = f"iter_{iteration:04d}"
        journal = Journal(log / "trajectories" / "train" / name / "rank_0.jsonl", resume=False)
        for task in range(tasks):
            messages = [{"role": "user", "content": f"What is {task} + {iteration}? Answer with the number only."}]
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            for sample, (reply, success) in enumerate(((str(task + iteration), True), (str(task - 1), False))):
                turn = Turn(
                    index=0,
                    messages=messages,
                    response=reply,
                    prompt_token_ids=tokenizer.encode(prompt, add_special_tokens=False),
                    completion_token_ids=[*tokenizer.encode(reply, add_special_tokens=False), end],
                    finish_reason="stop",
                )
                journal.append(
                    Trajectory(
                        episode_id=f"t{task}#{sample}",
                        task_id=f"t{task}",
                        sample_index=sample,
                        split="train",
                        iteration=iteration,
                        rank=0,
                        env="reasoning_gym",
                        family="chain_sum",
                        difficulty=1,
                        reward=float(success),
                        success=success,
                        turns=[turn],
                    )
                )
        journal.seal(planned=2 * tasks)
        state = log / "run" / "state" / name
        state.mkdir(parents=True, exist_ok=True)
        (state / "train_rollout.done").write_text("done\n")


def run_arm(data: Path, log: Path, warm: bool, steps: int) -> float:
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log)]
    cmd += ["--rl-phase", "update", "--wait-timeout", "0", f"algorithm.max_steps={steps}"]
    cmd += ["algorithm.per_device_train_batch_size=4", "algorithm.gradient_accumulation_steps=1"]
    cmd += ["algorithm.warmup_steps=0", "algorithm.cutoff_len=512"]
    env = {**os.environ, "BATON_WARM_TRAINER": str(int(warm)), "BATON_PROGRESS_S": "0"}
    began = time.monotonic()
    with open(log.parent / f"{log.name}.out", "w") as out:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        sys.exit(f"run.sh failed (exit {code}); see {log.parent / f'{log.name}.out'}")
    return time.monotonic() - began


def report(log: Path, iterations: int) -> list[dict]:
    rows = {r["iteration"]: r for r in load_metrics(log) if r.get("kind") == "training"}
    out = []
    for iteration in range(1, iterations + 1):
        update_s = phase_times(log, iteration).get("update", 0.0)
        steps_s = rows[iteration]["train_runtime_s"]
        out.append({"iteration": iteration, "update_s": update_s, "steps_s": steps_s, "fixed_s": update_s - steps_s})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=32, help="tasks per rollout (a success and a failure each)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per update")
    parser.add_argument("--arms", default="fresh,warm")
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
    with where or contextlib.nullcontext(tempfile.mkdtemp(prefix="baton-update-", dir=args.keep)) as tmp:
        for arm in args.arms.split(","):
            log = Path(tmp) / arm
            write_rollouts(data / "models" / MODEL, log, args.iterations, args.tasks)
            wall = run_arm(data, log, arm == "warm", args.steps)
            rows = report(log, args.iterations)
            parts = ", ".join(
                f"#{r['iteration']} {r['update_s']:.0f} s (steps {r['steps_s']:.1f}, fixed {r['fixed_s']:.1f})"
                for r in rows
            )
            later = [r["fixed_s"] for r in rows[1:]]
            after = f"; fixed cost after the first: max {max(later):.1f} s" if later else ""
            print(f"{arm:5s}: updates {parts}{after} (run.sh {wall:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
