"""Overhead of a multi-node iteration: the share of its wall time spent outside rollouts and optimizer steps.

    PYTHONPATH=. $BATON_APP_PY -m bench.multinode_overhead [--nodes 2] [--tasks 64] [--single-too] [--keep DIR]
        [--iterations 2] [--trainers fresh,warm] [--fs gluster]

Starts N real `scripts/run.sh` nodes (--master / --worker R, each with its own vLLM,
one shared temporary log path) for `--rl-phase both` on the default model and tasks,
then splits the master's time in each iteration (run/state/iter_<n>/times: rollouts,
update, serving the new policy) into useful work, the engines' own rollout time (the
slowest rank's `wall_s`, train and held-out) plus LLaMA-Factory's `train_runtime_s`,
and everything else: LLaMA-Factory and torchrun start-up, dataset preparation,
barriers, the master's merge, promotion and the reload of every node's vLLM. vLLM's
start before the first iteration is not counted.

- `--single-too`: one node on the same work beside it, so both shares come from one run.
- `--iterations N`: each iteration split apart (a warm trainer starts at the first
  update; the later ones show what every update costs).
- `--trainers fresh,warm`: each configuration once per trainer, fresh processes
  (BATON_WARM_TRAINER=0) beside the warm trainers (=1).
- `--fs PROFILE`: the log path on that shared filesystem (bench/sharedfs.py), each node in
  namespaces of its own with its own client, as in the multi-node tests.

Every run also reports each node's peak RSS (its whole process tree: run.sh, vLLM, the
engines, the trainer) and the in-place reloads of every node (p50, p95). Each of the N
nodes is bound (taskset, and vLLM's OpenMP binding) to its own share of this machine's
cores, as N machines would be; the single node has them all. Outside CI: 3-10 minutes
per configuration on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import PeakRss, cpu_line
from bench.nodes import node_command
from bench.sharedfs import PROFILES, SharedFs, shared_fs
from coordinator.runstate import phase_times
from rollout_engine.metrics_log import load_metrics

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_nodes(
    data: Path,
    log: Path,
    nodes: int,
    overrides: list[str],
    iterations: int = 1,
    warm: bool = True,
    fs: SharedFs | None = None,
) -> tuple[float, list[int], list[float]]:
    """Run `iterations` iterations on `nodes` nodes (with `fs`: each in namespaces of its own with its own client of
    it, bench/nodes.py); the wall time of the whole command, each node's peak RSS, and every in-place reload's
    seconds (each node's log). The nodes' outputs go beside the log path (with `fs`: in its state folder)."""
    out_dir = log.parent if fs is None else fs.state
    base = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log)]
    base += ["--rl-phase", "both", "--eval-interval", "1", "--max-iterations", str(iterations), *overrides]
    procs = []
    start = time.monotonic()
    for rank in range(nodes):
        cmd = list(base)
        if nodes > 1:
            cmd += ["--num-nodes", str(nodes), "--rank-weights", ",".join(["1"] * nodes)]
            cmd += ["--master"] if rank == 0 else ["--worker", str(rank)]
        env = {**os.environ, "BATON_VLLM_PORT": str(free_port()), "BATON_NODE_ADDR": "127.0.0.1"}
        env["BATON_WARM_TRAINER"] = str(int(warm))
        if fs is not None:
            cmd, extra = node_command(rank, REPO / "scripts/run.sh", cmd[2:], fs=fs)
            env |= extra
        if nodes > 1:  # a node is a machine: its own core(s), for vLLM, rollouts and its torchrun node alike
            cores = sorted(os.sched_getaffinity(0))
            mine = ",".join(str(c) for c in cores[rank::nodes]) or str(cores[rank % len(cores)])
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", mine)
            cmd = ["taskset", "-c", mine, *cmd]
        out = open(out_dir / f"{log.name}.node{rank}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    peaks = [PeakRss(proc.pid) for proc, _ in procs]
    for proc, out in procs:
        proc.wait()
        out.close()
        if proc.returncode != 0:
            sys.exit(f"a node failed (exit {proc.returncode}); see {out.name}")
    wall = time.monotonic() - start
    reloads = [float(m) for _, out in procs for m in RELOADED.findall(Path(out.name).read_text(errors="replace"))]
    return wall, [peak.stop() for peak in peaks], reloads


#: the driver's line for each in-place reload of a node's vLLM (coordinator/driver/vllm.py)
RELOADED = re.compile(r"vLLM reloaded \S+ in place in ([\d.]+)s")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def split(log: Path, iteration: int = 1) -> dict[str, float]:
    """The master's time in `iteration`, split into useful work and overhead."""
    times = phase_times(log, iteration)
    rows = [r for r in load_metrics(log) if r.get("iteration") == iteration]
    rollout = 0.0
    for split_name in ("train", "test"):
        row = next(r for r in rows if r.get("kind") == "rollout" and r.get("split") == split_name)
        walls = [r["wall_s"] for r in (row.get("per_rank") or {}).values() if r] or [row["wall_s"]]
        rollout += max(walls)
    training = next(r for r in rows if r.get("kind") == "training")
    iteration = sum(times.values())
    useful = rollout + training["train_runtime_s"]
    rollout_phases = times.get("train_rollout", 0.0) + times.get("test_rollout", 0.0)
    return {
        "iteration_s": iteration,
        "rollout_s": rollout,
        "optimizer_s": training["train_runtime_s"],
        "overhead_s": iteration - useful,
        "overhead_share": (iteration - useful) / iteration,
        # where the overhead went: around the engines (start-up, barriers, merge), LLaMA-Factory's own start-up
        # and save (its wall time less train_runtime), the rest of the update (prepare, promote, barrier), serving
        "over_rollouts_s": rollout_phases - rollout,
        "over_trainer_start_s": training["wall_s"] - training["train_runtime_s"],
        "over_prepare_promote_s": times.get("update", 0.0) - training["wall_s"],
        "over_serve_s": times.get("serve", 0.0),
        # the update less its optimizer steps (the weights' save included): the goal's fixed cost of an update
        "update_fixed_s": times.get("update", 0.0) - training["train_runtime_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=64, help="train tasks (x 4 samples)")
    parser.add_argument("--single-too", action="store_true", help="also one node on the same work, beside it")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' log paths and node outputs under DIR")
    parser.add_argument("--iterations", type=int, default=1, help="iterations each run (each split apart)")
    parser.add_argument("--trainers", default="warm", help="fresh, warm or fresh,warm: a run for each, side by side")
    parser.add_argument("--fs", choices=PROFILES, help="the log path on this shared filesystem (bench/sharedfs.py)")
    parser.add_argument(
        "--data-path", default=os.environ.get("BATON_DATA", str(Path.home() / ".cache/baton/bench-data"))
    )
    args = parser.parse_args()
    overrides = [
        f"env_config.train_tasks_rollout_size={args.tasks}",
        "env_config.n_samples_per_task=4",
        "env_config.test_tasks_rollout_size=-1",
        "env_config.test_greedy=true",
        "env_config.live_view=off",
        "policy_config.max_new_tokens=32",
        "algorithm.learning_rate=1e-4",
        "algorithm.warmup_steps=0",
        "algorithm.num_train_epochs=2",
        "algorithm.per_device_train_batch_size=4",
        "algorithm.gradient_accumulation_steps=1",
        "algorithm.cutoff_len=512",
    ]
    print(f"# {cpu_line()}")
    configs = [args.nodes, 1] if args.single_too else [args.nodes]
    kinds = args.trainers.split(",")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    where = tempfile.TemporaryDirectory(prefix="baton-overhead-") if not args.keep else None
    with contextlib.ExitStack() as stack:
        tmp = Path(
            stack.enter_context(
                where or contextlib.nullcontext(tempfile.mkdtemp(prefix="baton-overhead-", dir=args.keep))
            )
        )
        fs = stack.enter_context(shared_fs(tmp, args.fs)) if args.fs else None
        for nodes in configs:
            for kind in kinds:
                log = (fs.path if fs else tmp) / f"nodes{nodes}-{kind}"
                wall, peaks, reloads = run_nodes(
                    Path(args.data_path), log, nodes, overrides, args.iterations, kind == "warm", fs
                )
                rss = ", ".join(f"{peak / 2**30:.2f}" for peak in peaks)
                on = f"log path on {args.fs}" if fs else "log path on the local disk"
                print(f"{nodes} node(s), {kind} trainer, {on}: whole command {wall:.0f} s, peak RSS per node {rss} GiB")
                if reloads:
                    p50, p95 = percentile(reloads, 50), percentile(reloads, 95)
                    print(
                        f"  new policy live (in-place reloads, every node): {len(reloads)}, p50 {p50:.1f} s,"
                        f" p95 {p95:.1f} s, max {max(reloads):.1f} s"
                    )
                for iteration in range(1, args.iterations + 1):
                    parts = split(log, iteration)
                    print(
                        f"  iteration {iteration}: {parts['iteration_s']:.0f} s = rollouts {parts['rollout_s']:.0f} s"
                        f" + optimizer steps {parts['optimizer_s']:.0f} s + overhead {parts['overhead_s']:.0f} s"
                        f" -> overhead share {100 * parts['overhead_share']:.1f} %;"
                        f" the update's fixed cost {parts['update_fixed_s']:.1f} s"
                    )
                    over = [f"{k[5:-2]} {v:.0f} s" for k, v in parts.items() if k.startswith("over_")]
                    print("     overhead: " + ", ".join(over))


if __name__ == "__main__":
    main()
