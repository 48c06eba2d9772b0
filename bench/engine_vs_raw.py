"""Benchmark 2: engine tokens/s against a raw vLLM generation loop, side by side.

    PYTHONPATH=. $BATON_APP_PY -m bench.engine_vs_raw            # full run, starts its own vLLM
    PYTHONPATH=. $BATON_APP_PY -m bench.engine_vs_raw --quick    # small sanity run
    PYTHONPATH=. $BATON_APP_PY -m bench.engine_vs_raw --base-url http://127.0.0.1:8100/v1 --data-path /data

The engine side is the product itself: `python -m rollout_engine --config-name
rollout_test` with the reasoning_gym environment on the default test tasks
(greedy decoding, so both sides generate the same replies), and its own
`tokens_per_s` from `<log>/metrics.jsonl` (completion tokens / rollout wall
time, journal fsyncs, status.json and scoring included). The raw side sends
exactly the messages the engine sent (read back from its journal) with the
plain `openai` async client: same max_tokens, same temperature, same
concurrency, no environment, nothing written. The prefix cache is reset before
every measured run when the server allows it (dev-mode vLLM, as the driver's
PolicyServer starts it). The last line printed is the ratio engine / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.server import REPO, add_server_args, bench_logging, prepare_data, serve
from rollout_engine.files import read_jsonl
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics

logger = logging.getLogger("bench.engine_vs_raw")


@dataclass
class Run:
    """One measured run: completion tokens over wall seconds."""

    side: str
    completion_tokens: int
    wall_s: float
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.engine_vs_raw", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--quick", action="store_true", help="small sanity run (16 requests, concurrency 8, 1 round)")
    parser.add_argument("--tasks", type=int, default=80, help="first N test tasks (default 80)")
    parser.add_argument("--repeat", type=int, default=2, help="episodes per task (default 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight on both sides (default 32)")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (default 128)")
    parser.add_argument("--rounds", type=int, default=2, help="engine+raw pairs to run (default 2)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.repeat, args.concurrency, args.rounds = 16, 1, 8, 1
    for name in ("tasks", "repeat", "concurrency", "max_tokens", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    return args


def reset_prefix_cache(base_url: str) -> None:
    """Start each run with a cold prefix cache (only dev-mode servers allow it; else go on)."""
    root = base_url.removesuffix("/v1")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{root}/reset_prefix_cache", method="POST"), timeout=10)
    except (urllib.error.URLError, OSError) as exc:
        logger.warning("could not reset the prefix cache (%s); runs may share cached prefixes", exc)


def engine_command(args: argparse.Namespace, base_url: str, log_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "rollout_engine", "--config-name", "rollout_test",
        f"data_path={args.data_path.resolve()}", f"log_path={log_path}",
        f"policy_config.base_url={base_url}", f"policy_config.model={args.model}",
        "policy_config.temperature=0", f"policy_config.max_new_tokens={args.max_tokens}",
        f"env_config.max_vllm_sessions={args.concurrency}", f"env_config.server_size={args.concurrency}",
        f"env_config.test_tasks_rollout_size={args.tasks}", f"env_config.test_tasks_repeat_times={args.repeat}",
        "env_config.live_view=plain",
    ]  # fmt: skip


def run_engine(args: argparse.Namespace, base_url: str, log_path: Path) -> tuple[Run, list[list[dict[str, Any]]]]:
    """The rollout CLI; returns its own tokens/s measurement and the messages it sent, in plan order."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        engine_command(args, base_url, log_path),
        cwd=REPO,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"the rollout engine failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    metrics = load_metrics(log_path)[-1]
    if metrics["failures"]:
        raise SystemExit(f"engine episodes failed: {metrics['failures']}; the comparison would be unfair")
    journal = Layout(log_path).journal("test", 0, rank=0)
    rows = sorted(read_jsonl(journal).rows, key=lambda r: r["episode_id"])
    tokens = sum(t["completion_tokens"] for r in rows for t in r["turns"])
    run = Run("engine", tokens, metrics["wall_s"], len(rows))
    if abs(tokens / metrics["wall_s"] - metrics["tokens_per_s"]) > 0.01 * metrics["tokens_per_s"] + 0.01:
        logger.warning(
            "journal tokens/s %.1f differ from the engine's metric %.1f", run.tokens_per_s, metrics["tokens_per_s"]
        )
    return run, [r["turns"][0]["messages"] for r in rows]


async def run_raw(args: argparse.Namespace, base_url: str, prompts: list[list[dict[str, Any]]]) -> Run:
    """The plain loop: one asyncio task per prompt, a semaphore of `concurrency`, no environment."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=120.0)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(messages: list[dict[str, Any]]) -> int:
        async with limit:
            resp = await client.chat.completions.create(
                model=args.model,
                messages=messages,
                temperature=0.0,
                top_p=1.0,
                max_tokens=args.max_tokens,
                extra_body={"return_token_ids": True},
            )  # the engine asks for token ids too
        return resp.usage.completion_tokens

    started = time.monotonic()
    try:
        tokens = await asyncio.gather(*(one(m) for m in prompts))
    finally:
        await client.close()
    return Run("raw", sum(tokens), time.monotonic() - started, len(prompts))


def compare(args: argparse.Namespace, base_url: str) -> list[tuple[Run, Run]]:
    pairs = []
    with tempfile.TemporaryDirectory(prefix="baton-bench-log-") as logs:
        for index in range(args.rounds):
            reset_prefix_cache(base_url)
            engine, prompts = run_engine(args, base_url, Path(logs) / f"round_{index}")
            print(
                f"  round {index + 1}/{args.rounds} engine: {engine.completion_tokens} tokens in "
                f"{engine.wall_s:.1f} s = {engine.tokens_per_s:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
            reset_prefix_cache(base_url)
            raw = asyncio.run(run_raw(args, base_url, prompts))
            print(
                f"  round {index + 1}/{args.rounds} raw:    {raw.completion_tokens} tokens in "
                f"{raw.wall_s:.1f} s = {raw.tokens_per_s:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
            pairs.append((engine, raw))
    return pairs


def warm_up(args: argparse.Namespace, base_url: str) -> None:
    prompts = [[{"role": "user", "content": f"Warm up {i}: 2 + {i} ="}] for i in range(8)]
    asyncio.run(run_raw(args, base_url, prompts))


def main(argv: list[str] | None = None) -> int:
    bench_logging()
    args = parse_args(argv)
    if args.base_url:
        prepare_data(args.data_path)
    with serve(args) as base_url:
        print(
            f"{args.tasks} tasks x {args.repeat}, concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
            f"{args.rounds} round(s)",
            file=sys.stderr,
            flush=True,
        )
        warm_up(args, base_url)
        pairs = compare(args, base_url)
    for index, (engine, raw) in enumerate(pairs, 1):
        print(
            f"round {index}: engine {engine.tokens_per_s:6.1f} tokens/s ({engine.completion_tokens} tokens, "
            f"{engine.wall_s:.1f} s)  raw {raw.tokens_per_s:6.1f} tokens/s ({raw.completion_tokens} tokens, "
            f"{raw.wall_s:.1f} s)  ratio {engine.tokens_per_s / raw.tokens_per_s:.3f}"
        )
    engine_rate = sum(e.completion_tokens for e, _ in pairs) / sum(e.wall_s for e, _ in pairs)
    raw_rate = sum(r.completion_tokens for _, r in pairs) / sum(r.wall_s for _, r in pairs)
    print(
        f"engine_vs_raw: engine/raw tokens/s = {engine_rate / raw_rate:.3f} "
        f"(engine {engine_rate:.1f} vs raw {raw_rate:.1f} tokens/s at concurrency {args.concurrency}, "
        f"{len(pairs)} round(s) of {pairs[0][0].requests} requests)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
