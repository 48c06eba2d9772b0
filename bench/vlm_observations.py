"""Benchmark: a vision-language agent's rollouts on MiniWoB++ text-only against with screenshots, side by side.

    PYTHONPATH=. $BATON_APP_PY -m bench.vlm_observations                  # 3 modes x 2 repeats, 16 episodes (~4 min)
    PYTHONPATH=. $BATON_APP_PY -m bench.vlm_observations --repeats 3 --modes text,both

One vLLM serves the toy Qwen3-VL of tests/e2e/toy_vlm.py (random vision tower, a designed text part that answers
`click(e3|e4|e5)`; built in the train environment on first use, then cached under --model-dir), started by the
driver's PolicyServer with the multimodal limit and the allowed media path a vision-language run gets
(`{image: N, video: 0}`, the folder holding every rollout's log path). Then the product's rollout CLI
(`python -m rollout_engine --config-name rollout_test env=miniwob ...`, real Chromium) runs the same click-test
pages once per observation mode (`env.observation=text|screenshot|both`), the modes alternating within each
repeat (their order rotated) so that other load on the machine hits them alike. From each rollout: the engine's
own `episodes_per_s` (<log>/metrics.jsonl: episodes / rollout wall time, browser start excluded), the process's
wall time, success, and from the journal the prompt tokens per turn and the image tokens among them (the count of
the model's image pad id in each turn's prompt_token_ids). The prefix cache is reset before each rollout.
Prints the CPU model and flags, a line per rollout, a table per mode, and as its last line the ratios of
episodes/s to text-only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.engine_vs_raw import reset_prefix_cache
from bench.measure import cpu_line
from bench.server import REPO, _raise_interrupt, bench_logging, env_python, free_port
from coordinator.driver import say
from coordinator.driver.procs import Groups
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import for_node
from rollout_engine.config import VllmConfig
from rollout_engine.envs.miniwob import build_tasks
from rollout_engine.errors import ConfigError
from rollout_engine.files import read_jsonl
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics

logger = logging.getLogger("bench.vlm_observations")
MODES = ("text", "screenshot", "both")


@dataclass(frozen=True)
class Rollout:
    """One rollout of one observation mode: the engine's figures and the journal's."""

    mode: str
    episodes: int
    episodes_per_s: float
    engine_wall_s: float
    process_wall_s: float
    success: float
    #: (step index, prompt tokens, image tokens) of every turn in the journal
    turns: tuple[tuple[int, int, int], ...]

    @property
    def prompt_tokens(self) -> float:
        return statistics.fmean(t[1] for t in self.turns)

    @property
    def image_tokens(self) -> float:
        return statistics.fmean(t[2] for t in self.turns)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.vlm_observations", description=__doc__.split("\n\n")[0])
    cache = Path.home() / ".cache" / "baton"
    parser.add_argument("--model-dir", type=Path, default=cache / "bench-vlm" / "qwen3-vl-toy")
    parser.add_argument("--toy-cache", type=Path, default=cache / "toy-models", help="toy_vlm.py's download cache")
    parser.add_argument("--work", type=Path, default=None, help="data and log paths (default: a temp dir)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated env.observation values")
    parser.add_argument("--repeats", type=int, default=2, help="rollouts of each mode (default 2)")
    parser.add_argument("--pages", type=int, default=8, help="click-test pages (default 8)")
    parser.add_argument("--samples", type=int, default=2, help="episodes per page (default 2)")
    parser.add_argument("--max-steps", type=int, default=2, help="env.max_steps (default 2)")
    parser.add_argument("--viewport", default="320,240", help="env.viewport as W,H (default 320,240)")
    parser.add_argument("--images", type=int, default=2, help="images per prompt: limit_mm_per_prompt.image")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="policy_config.max_new_tokens (default 8)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"--modes must name some of {', '.join(MODES)} (got {args.modes!r})")
    args.modes = modes
    for name in ("repeats", "pages", "samples", "max_steps", "images", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    return args


def toy_model(args: argparse.Namespace) -> Path:
    """The toy Qwen3-VL folder, built by tests/e2e/toy_vlm.py unless --model-dir holds one already."""
    if (args.model_dir / "config.json").is_file():
        return args.model_dir
    logger.info("building the toy Qwen3-VL into %s (tests/e2e/toy_vlm.py)", args.model_dir)
    toy = ["tests/e2e/toy_vlm.py", "--out", str(args.model_dir), "--cache", str(args.toy_cache)]
    command = [env_python("train"), *toy]
    if subprocess.run(command, cwd=REPO, check=False, stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit(f"tests/e2e/toy_vlm.py could not build {args.model_dir}; see above")
    return args.model_dir


def rollout_command(args: argparse.Namespace, base_url: str, data: Path, log: Path, mode: str) -> list[str]:
    width, height = args.viewport.split(",")
    return [
        sys.executable, "-m", "rollout_engine", "--config-name", "rollout_test", "env=miniwob",
        f"data_path={data}", f"log_path={log}", "env_config.test_tasks=tasks/test.jsonl",
        f"policy_config.base_url={base_url}", "policy_config.model=policy",
        f"policy_config.max_new_tokens={args.max_new_tokens}", "env_config.live_view=plain",
        f"env_config.test_tasks_rollout_size={args.pages}", f"env_config.n_samples_per_task={args.samples}",
        f"env.observation={mode}", f"env.viewport=[{width},{height}]", f"env.max_steps={args.max_steps}",
        f"+vllm_config.limit_mm_per_prompt={{image:{args.images},video:0}}",
    ]  # fmt: skip


def run_rollout(args: argparse.Namespace, base_url: str, data: Path, log: Path, mode: str, pad: int) -> Rollout:
    reset_prefix_cache(base_url)
    started = time.monotonic()
    out = subprocess.run(
        rollout_command(args, base_url, data, log, mode),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    process_wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"the rollout engine failed ({mode}, exit {out.returncode}):\n{out.stderr[-3000:]}")
    metrics = load_metrics(log)[-1]
    if metrics["failures"]:
        raise SystemExit(f"{mode}: episodes failed: {metrics['failures']}; the comparison would be unfair")
    rows = read_jsonl(Layout(log).journal("test", 0, rank=0)).rows
    turns = tuple(
        (step, len(turn["prompt_token_ids"]), turn["prompt_token_ids"].count(pad))
        for row in rows
        for step, turn in enumerate(row["turns"])
    )
    return Rollout(
        mode,
        len(rows),
        metrics["episodes_per_s"],
        metrics["wall_s"],
        process_wall,
        sum(row["success"] for row in rows) / len(rows),
        turns,
    )


def measure(args: argparse.Namespace, model: Path, work: Path) -> list[Rollout]:
    """Serve the model once, then the rollouts, alternating the modes; stop exactly the vLLM we started."""
    data, logs, run_dir = work / "data", work / "logs", work / "vllm"
    (data / "tasks").mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    rows = build_tasks(["click-test"], args.pages, seed=2)
    (data / "tasks" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pad = json.loads((model / "config.json").read_text())["image_token_id"]
    try:
        cfg = VllmConfig(limit_mm_per_prompt={"image": args.images, "video": 0}, allowed_local_media_path=str(logs))
        settings = for_node(cfg, model, str(logs))
    except ConfigError as exc:
        raise SystemExit("; ".join(exc.problems)) from exc
    port = free_port()
    serve_py = env_python("serve")
    server = PolicyServer(run_dir, port, "policy", Groups(run_dir), Supervisor(), serve_py, settings=settings)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    results: list[Rollout] = []
    try:
        logger.info("starting vLLM on port %d (log: %s)", port, server.log)
        started = time.monotonic()
        try:
            server.start(str(model), deadline_s=900)
        except say.Ended as exc:
            raise SystemExit(f"vLLM did not start (exit {exc.code}: {exc.message}); see {server.log}") from exc
        logger.info("vLLM serves %s in %s after %.0f s", model, server.dtype, time.monotonic() - started)
        base_url = f"http://127.0.0.1:{port}/v1"
        total = args.repeats * len(args.modes)
        for repeat in range(args.repeats):
            shift = repeat % len(args.modes)
            for mode in args.modes[shift:] + args.modes[:shift]:
                run = run_rollout(args, base_url, data, logs / f"{mode}-{repeat}", mode, pad)
                results.append(run)
                logger.info(
                    "[%d/%d] %-10s %d episodes in %.1f s (engine; process %.1f s) = %.3f episodes/s, success %.0f %%,"
                    " %.0f prompt tokens a turn (%.0f image tokens)",
                    len(results), total, mode, run.episodes, run.engine_wall_s, run.process_wall_s,
                    run.episodes_per_s, 100 * run.success, run.prompt_tokens, run.image_tokens,
                )  # fmt: skip
    finally:
        logger.info("stopping the vLLM we started (process group in %s/pids)", run_dir)
        server.stop()
        signal.signal(signal.SIGTERM, previous)
    return results


def tokens(turns: list[tuple[int, int, int]]) -> str:
    """Mean prompt tokens (image tokens among them) of `turns`, and how many turns."""
    if not turns:
        return "none"
    prompt, image = statistics.fmean(t[1] for t in turns), statistics.fmean(t[2] for t in turns)
    return f"{prompt:.0f} ({image:.0f}), {len(turns)} turns"


def main(argv: list[str] | None = None) -> int:
    bench_logging()
    args = parse_args(argv)
    model = toy_model(args)
    print(f"cpu: {cpu_line()}")
    if args.work:
        results = measure(args, model, args.work.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="baton-bench-vlm-") as work:
            results = measure(args, model, Path(work))
    print(
        f"{args.pages} click-test pages x {args.samples}, {args.max_steps} steps, viewport {args.viewport}, "
        f"at most {args.images} images a prompt, {args.repeats} rollouts of each mode"
    )
    steps = range(args.max_steps)
    by_step = " | ".join(f"turn {step + 1}: prompt (image) tokens" for step in steps)
    print(f"| observation | episodes/s (each rollout) | rollout wall s | success | {by_step} | all turns |")
    print("|---|---|---|---|" + "---|" * (len(steps) + 1))
    rates: dict[str, float] = {}
    for mode in args.modes:
        runs = [r for r in results if r.mode == mode]
        rates[mode] = sum(r.episodes for r in runs) / sum(r.engine_wall_s for r in runs)
        each = ", ".join(f"{r.episodes_per_s:.2f}" for r in runs)
        walls = ", ".join(f"{r.engine_wall_s:.1f}" for r in runs)
        success = ", ".join(f"{100 * r.success:.0f} %" for r in runs)
        cells = [tokens([t for r in runs for t in r.turns if t[0] == step]) for step in steps]
        cells.append(tokens([t for r in runs for t in r.turns]))
        print(f"| {mode} | {rates[mode]:.2f} ({each}) | {walls} | {success} | {' | '.join(cells)} |")
    if "text" in rates and len(rates) > 1:
        ratios = [f"{mode} / text = {rates[mode] / rates['text']:.3f}" for mode in rates if mode != "text"]
        print(f"vlm_observations: episodes/s {', '.join(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
