"""README command 1, `bash scripts/quickstart.sh`, end to end with two short iterations (issue 11), which is
also the suite's `--rl-phase both` loop on one node.

The script itself runs (setup, prepare, run.sh with the quickstart's settings, the table and the plot), cut down by
its documented override arguments (later overrides win) and `BATON_QUICKSTART_ITERATIONS=2`: 96 train tasks once
each at temperature 0.5, 8 held-out tasks, one optimizer step per update, `tracker=tensorboard`. Its data folder
starts as hard links of the session's prepared data (scripts/prepare.sh finds the model and tasks ready: it is run
by the `data_dir` fixture for real). Iteration 1 rolls out, evaluates the base model and promotes v1, which is
reloaded in place and serves iteration 2 (no held-out rollout: 2 % 2 != 1); iteration 2 promotes v2, which the
final evaluation (iteration 3) is served. One warm trainer trains both updates. Metrics, plot, TensorBoard curves,
no process left.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from coordinator import groupfile
from rollout_engine.layout import Layout
from tests.conftest import REPO
from tests.e2e.conftest import processes_mentioning
from tests.waits import UPDATE_S, VLLM_START_S, generation_s, run_waiting

pytestmark = pytest.mark.e2e

#: each update needs a success to train on: 96 tasks once each at temperature 0.5 find none about 8e-6 of the
#: time, 24 x 4 at the quickstart's 1 about once in 32 (docs/benchmarks.md 3h)
SHORT = [
    "env_config.train_tasks_rollout_size=96",
    "env_config.n_samples_per_task=1",
    "policy_config.temperature=0.5",
    "env_config.test_tasks_rollout_size=8",
    "algorithm.max_steps=1",
    "algorithm.per_device_train_batch_size=1",
    "algorithm.num_train_epochs=1",
    "tracker=tensorboard",
]


def test_quickstart_runs_two_short_iterations_promotes_serves_records_and_evaluates_the_last_policy(
    data_dir: Path, tmp_path: Path
) -> None:
    subprocess.run(["cp", "-al", str(data_dir), str(tmp_path / "data")], check=True)
    env = {**os.environ, "BATON_QUICKSTART_ITERATIONS": "2", "BATON_PROGRESS_S": "0"}
    out = run_waiting(
        ["bash", str(REPO / "scripts/quickstart.sh"), "--dir", str(tmp_path), *SHORT],
        waiting_for="the quickstart's two iterations and final evaluation",
        timeout=VLLM_START_S + generation_s(2 * 96 + 8 + 8, 32) + 2 * UPDATE_S,
        cwd=REPO,
        env=env,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    (log,) = (tmp_path / "logs").iterdir()
    # the quickstart's settings reached the run, and the overrides given after them won
    config = (log / "run" / "rank_0" / "resolved.yaml").read_text()
    assert "test_greedy: true" in config and "learning_rate: 0.0001" in config
    assert "train_tasks_rollout_size: 96" in config and "max_steps: 1" in config

    first, second = journal(log, "train", 1), journal(log, "train", 2)
    assert len(first) == len(second) == 96
    assert {t["policy_version"] for t in first} == {None} and {t["policy_version"] for t in second} == {1}
    assert journal(log, "test", 1) and not (log / "trajectories" / "test" / "iter_0002").exists()  # 2 % 2 != 1
    assert {t["policy_version"] for t in journal(log, "test", 3)} == {2}  # the final evaluation: the last policy
    record = json.loads((log / "policy" / "v0001" / "baton_policy.json").read_text())
    assert (record["version"], record["iteration"]) == (1, 1)  # trained on iteration 1, served in iteration 2
    # promoted in the dtype vLLM computes in on this machine when wider than the base model's bf16: the
    # trainer's fp32 weights as they are (docs/update.md, "Dtype"); else bf16, the fp32 ones kept beside
    computes_in = json.loads((log / "run" / "rank_0" / "serving.json").read_text())["dtype"]
    wider = computes_in == "float32"
    assert (record["dtype"], record["full_precision"]) == ("float32" if wider else "bfloat16", not wider), record
    assert os.readlink(log / "policy" / "current") == "v0002"  # iteration 2's update promoted the next one
    # the optimizer carried (docs/update.md): iteration 2's update (1 step) started from v0001's Adam and step
    carried = [json.loads((log / "policy" / v / "optimizer" / "state.json").read_text()) for v in ("v0001", "v0002")]
    assert [(c["optimizer_steps"], c["moments"]) for c in carried] == [(1, True), (2, True)], carried
    assert carried[0]["parameters"] > 0 and (log / "policy" / "v0002" / "optimizer" / "moments.safetensors").is_file()
    said = (log / "training" / "iter_0002" / "train.log").read_text()
    assert f"carry from {log}/policy/v0001/optimizer: 1 optimizer steps before this update" in said, said[-3000:]
    assert f"Adam's moments of {carried[0]['parameters']} parameters" in said
    served = (log / "run" / "state" / "iter_0001" / "serve.done").read_text().strip()
    assert served == "v1 by reload", served  # in place (the restart fallback: tests/unit/driver/test_vllm.py)

    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    iterations = {r["iteration"]: r for r in rows if r.get("kind") == "iteration"}
    # iterations 1 and 2 (train; held-out at 1), then 3, the final held-out evaluation only
    assert sorted(iterations) == [1, 2, 3]
    assert (iterations[1]["train_episodes"], iterations[1]["eval_episodes"]) == (96, 8)
    assert iterations[2]["eval_success_rate"] is None and iterations[2]["served_version"] == 1
    assert (iterations[3].get("train_episodes"), iterations[3]["eval_episodes"]) == (None, 8)
    assert iterations[1]["promoted_version"] == 1 and iterations[1]["update"] == "promoted v1"
    assert iterations[1]["train_loss"] is not None and {"train_rollout", "update", "serve"} <= set(
        iterations[1]["phase_s"]
    )
    # the update's records, merged by the master from the update's own file (rollout_engine.metrics_log): each once
    assert [(r["kind"], r["iteration"]) for r in rows if "update_seq" in r] == [
        ("training", 1),
        ("promotion", 1),
        ("training", 2),
        ("promotion", 2),
    ]
    # one warm trainer (docs/update.md) trained both updates, in the same process
    trainers = [r["trainer"] for r in rows if r.get("kind") == "training"]
    assert len(set(trainers)) == 1 and trainers[0].startswith("warm:"), trainers
    assert (log / "run" / "state" / "iter_0002" / "config.yaml").exists()

    # what it prints: the table (a row per iteration), the plot, the time
    assert "success per iteration" in out.stdout
    table = out.stdout.split("success per iteration", 1)[1].splitlines()
    assert [line.split()[0] for line in table if line.strip()[:1].isdigit()] == ["1", "2", "3"]
    assert f"plot: {log}/plots/success.png" in out.stdout
    assert (log / "plots" / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "quickstart finished in" in text
    tracked = tensorboard_scalars(log / "trackers" / "tensorboard")  # tracker=tensorboard
    assert [step for step, _ in tracked["iteration/train_success_rate"]] == [1, 2]
    assert tracked["training/train_loss"][0] == (1, pytest.approx(iterations[1]["train_loss"]))
    curves = tensorboard_scalars(log / "training" / "iter_0001" / "tensorboard")  # LLaMA-Factory's report_to
    assert curves["train/loss"], sorted(curves)
    assert groupfile.read(Layout(log).groups(0)) == {}
    assert processes_mentioning(str(tmp_path)) == []


def journal(log: Path, split: str, iteration: int) -> list[dict]:
    path = Layout(log).journal(split, iteration, 0)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series under a TensorBoard log dir (TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
