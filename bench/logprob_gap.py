"""Log-probability fidelity and the cost of recording log-probabilities, measured on a real rollout.

    PYTHONPATH=. $BATON_APP_PY -m bench.logprob_gap                                  # both vLLM dtypes (~10 min)
    PYTHONPATH=. $BATON_APP_PY -m bench.logprob_gap --vllm-dtypes bfloat16 --tasks 8 # quicker

For each vLLM dtype (`BATON_VLLM_DTYPE`, everything else as run.sh serves it): roll out the default tasks with
the product's engine (`rollout_train`, temperature 1, log-probabilities recorded), turn every step of the
journal into a dataset (training.dataset, as an update writes it), then recompute the sampled tokens'
log-probabilities with Hugging Face transformers in float32 and in bfloat16 (training.logprob_check, train
environment) and print the gap to vLLM's. With `--cost`, the same server also answers `--requests` requests of
exactly `--tokens` tokens with and without `logprobs` (alternating, twice each): tokens/s and response bytes
per token, side by side. With `--mismatch`, also what a real mistake gives (bench.logprob_mismatch: a trainer
dividing its logits by a temperature).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

import openai

from bench.measure import cpu_line
from bench.server import REPO, add_server_args, bench_logging, env_python, own_servers_only, serve
from rollout_engine.journal import read_journal
from rollout_engine.layout import Layout
from training.dataset import save_dataset
from training.selection import KTOSelector

logger = logging.getLogger("bench.logprob_gap")
PROMPT = "Write a short story about a lighthouse keeper. Question {i}: what is {i} + 7?"


def rollout(base_url: str, model: str, data: Path, log: Path, tasks: int, samples: int, tokens: int) -> None:
    cmd = [
        env_python("app"), "-m", "rollout_engine", "--config-name", "rollout_train", f"data_path={data}",
        f"log_path={log}", f"policy_config.base_url={base_url}", f"policy_config.model={model}",
        f"policy_config.max_new_tokens={tokens}", f"env_config.train_tasks_rollout_size={tasks}",
        f"env_config.n_samples_per_task={samples}", "env_config.live_view=plain",
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the rollout failed (exit {out.returncode})")


def dataset_of(log: Path, out: Path) -> int:
    """Every step of the rollout's journals as a dataset; the number of rows."""
    journals = sorted(Layout(log).iteration_dir("train", 0).glob("rank_*.jsonl"))
    trajectories = [t for path in journals for t in read_journal(path)]
    selection = KTOSelector(skip_unchanged_steps=False).select(trajectories, 0, cutoff_len=1_000_000)
    return save_dataset(selection.samples, out, "kto").train_rows


def gap(dataset: Path, model_dir: Path, dtype: str) -> dict:
    cmd = [env_python("train"), "-m", "training.logprob_check", str(dataset), str(model_dir), "--dtype", dtype]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, capture_output=True)
    if out.returncode not in (0, 2):
        raise SystemExit(f"training.logprob_check failed (exit {out.returncode}): {out.stderr[-2000:]}")
    if out.returncode == 2:  # refused: the numbers are in the message
        return {"refused": out.stderr.strip().splitlines()[-1], "seconds": time.perf_counter() - start}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "seconds": round(time.perf_counter() - start, 1)}


async def cost(base_url: str, model: str, requests: int, tokens: int, logprobs: bool) -> tuple[float, float]:
    """(tokens/s, response bytes per completion token) of `requests` replies of exactly `tokens` tokens, all in
    flight, with return_token_ids and with or without the sampled tokens' logprobs."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", timeout=3600)
    extra = {"logprobs": True, "top_logprobs": 0} if logprobs else {}

    async def one(i: int) -> tuple[int, int]:
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT.format(i=i)}],
            max_tokens=tokens,
            temperature=1.0,
            extra_body={"min_tokens": tokens, "ignore_eos": True, "return_token_ids": True},
            **extra,
        )
        return raw.parse().usage.completion_tokens, len(raw.http_response.content)

    await one(-1)  # warm-up
    start = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.perf_counter() - start
    await client.close()
    made = sum(n for n, _ in done)
    return made / wall, sum(b for _, b in done) / made


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.logprob_gap", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--vllm-dtypes", default="bfloat16,float32", help="comma-separated serving dtypes")
    parser.add_argument("--tasks", type=int, default=16, help="train tasks rolled out")
    parser.add_argument("--samples", type=int, default=4, help="samples per task")
    parser.add_argument("--tokens", type=int, default=128, help="max_new_tokens of the rollout")
    parser.add_argument("--cost", action="store_true", help="also measure tokens/s and bytes with/without logprobs")
    parser.add_argument(
        "--mismatch", action="store_true", help="also a trainer applying temperature (logprob_mismatch)"
    )
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--cost-tokens", type=int, default=64)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    bench_logging("[bench] %(message)s")
    args = parse_args(argv)
    own_servers_only(args, "bench.logprob_gap", "its own vLLM per dtype")
    print(f"cpu: {cpu_line()}")
    model_dir = args.data_path.resolve() / "models" / "SmolLM2-135M-Instruct"
    work = Path(tempfile.mkdtemp(prefix="baton-logprob-gap-"))
    for served in args.vllm_dtypes.split(","):
        os.environ["BATON_VLLM_DTYPE"] = served
        log = work / f"log-{served}"
        with serve(args) as base_url:
            rollout(base_url, args.model, args.data_path, log, args.tasks, args.samples, args.tokens)
            if args.cost:
                for logprobs in (False, True, False, True):
                    rate, size = asyncio.run(cost(base_url, args.model, args.requests, args.cost_tokens, logprobs))
                    print(f"vLLM {served}, logprobs {'on ' if logprobs else 'off'}: {rate:.1f} tokens/s, "
                          f"{size:.1f} response bytes per token")  # fmt: skip
        rows = dataset_of(log, work / f"data-{served}")
        for trainer in ("float32", "bfloat16"):
            found = gap(work / f"data-{served}", model_dir, trainer)
            print(f"vLLM {served} vs transformers {trainer} ({rows} rows): {json.dumps(found)}")
        if args.mismatch:
            cmd = [env_python("train"), "-m", "bench.logprob_mismatch", str(work / f"data-{served}"), str(model_dir)]
            out = subprocess.run(
                cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, stdout=subprocess.PIPE
            )
            print("".join(f"vLLM {served}, {line}\n" for line in out.stdout.splitlines()), end="")
    print(f"journals and datasets kept in {work}")


if __name__ == "__main__":
    main()
