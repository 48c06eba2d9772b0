"""Benchmark 3: vLLM generation speed in float32 against bfloat16 on this CPU, side by side.

    PYTHONPATH=. $BATON_APP_PY -m bench.serving_dtype                       # 32 in flight, both dtypes (~6 min on AVX2)
    PYTHONPATH=. $BATON_APP_PY -m bench.serving_dtype --concurrency 8,16,32,64 --dtypes float32   # pick defaults

Each dtype gets its own vLLM, started by the product's shell library with
`BATON_VLLM_DTYPE` forcing the dtype (everything else as run.sh serves it),
and the same workload: `--requests` chat requests of exactly `--tokens`
tokens each (`min_tokens = max_tokens`, temperature 1), at most
`--concurrency` in flight. Prints the CPU model and flags, a table of tokens/s,
and as its last line the ratio float32 / bfloat16 at the first concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

import openai

from bench.measure import cpu_line
from bench.server import add_server_args, bench_logging, own_servers_only, serve

logger = logging.getLogger("bench.serving_dtype")
PROMPT = "Write a short story about a lighthouse keeper. Question {i}: what is {i} + 7?"


async def measure(base_url: str, model: str, requests: int, tokens: int, concurrency: int) -> float:
    """Tokens/s of `requests` replies of exactly `tokens` tokens, at most `concurrency` in flight."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", timeout=3600)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with gate:
            reply = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": PROMPT.format(i=i)}],
                max_tokens=tokens,
                temperature=1.0,
                extra_body={"min_tokens": tokens, "ignore_eos": True},
            )
            return reply.usage.completion_tokens

    await one(-1)  # warm-up: the first request pays one-off costs
    start = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.perf_counter() - start
    await client.close()
    return sum(done) / wall


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.serving_dtype", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes (default: both)")
    parser.add_argument("--concurrency", default="32", help="comma-separated requests in flight (default: 32)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    bench_logging("[bench] %(message)s")
    args = parse_args(argv)
    own_servers_only(args, "bench.serving_dtype", "its own vLLM per dtype")
    dtypes = args.dtypes.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"cpu: {cpu_line()}")
    results: dict[tuple[str, int], float] = {}
    for dtype in dtypes:
        os.environ["BATON_VLLM_DTYPE"] = dtype
        with serve(args) as base_url:
            for level in levels:
                rate = asyncio.run(measure(base_url, args.model, args.requests, args.tokens, level))
                results[dtype, level] = rate
                logger.info("%s, %d in flight: %.1f tokens/s", dtype, level, rate)
    print(f"\n{args.requests} requests x {args.tokens} tokens")
    print(f"{'in flight':>10}" + "".join(f"{d:>12}" for d in dtypes))
    for level in levels:
        print(f"{level:>10}" + "".join(f"{results[d, level]:>12.1f}" for d in dtypes))
    if len(dtypes) == 2:
        a, b = dtypes
        print(f"{a} / {b} at {levels[0]} in flight: {results[a, levels[0]] / results[b, levels[0]]:.2f}x")


if __name__ == "__main__":
    main()
