"""The update phase end to end: real rollouts -> LLaMA-Factory -> a promoted policy.

The rollout engine writes a real train journal of the default model (token ids
from vLLM). The fidelity check fails loudly on those rollouts when a template
that renders the prompt differently reaches a training YAML behind the
update-check's back (which refuses it up front: test_llamafactory_check.py).
`run.sh --rl-phase update` on those rollouts stops every training process on
Ctrl+C (torchrun's workers included); on the next run the update phase
(`python -m training`, train environment) selects, writes and checks the dataset
(the fidelity check passes), trains one optimizer step of a full fine-tune and
promotes it (that vLLM then serves different outputs is pinned by the loop e2e:
its in-place reload counts only when the greedy tokens and logprobs change).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rollout_engine.layout import Layout
from tests.conftest import REPO, default_sigint, env_python
from tests.e2e.conftest import processes_mentioning, train_script_result
from tests.waits import UPDATE_S, communicate_waiting, run_waiting
from training.logprob_check import WARN_MEAN_GAP
from training.warm import done_name

pytestmark = pytest.mark.e2e


@pytest.fixture
def journal_log(train_journal: Path, tmp_path: Path) -> Path:
    """A copy of the session's real train rollout (each test trains and promotes on its own log path)."""
    log = tmp_path / "log"
    shutil.copytree(train_journal, log)
    return log


def test_an_update_that_would_not_fit_on_the_disk_is_refused_before_it_trains(
    journal_log: Path, model_dir: Path
) -> None:
    """The log path on a 300 MB filesystem (a tmpfs mounted in a mount namespace of this test's own): the update
    prepares its dataset, then refuses to train the 135M model, whose fp32 output and served copy take about
    0.8 GB, saying so; no trainer starts and no policy is promoted."""
    cmd = [env_python("train"), "-m", "training", "--config-name", "update", "log_path=$SMALL", "iteration=0"]
    cmd += [
        f"model_path={model_dir}",
        "algorithm.per_device_train_batch_size=1",
        "algorithm.gradient_accumulation_steps=1",
    ]
    inside = (
        'mkdir "$SMALL" && mount -t tmpfs -o size=300m baton-test "$SMALL" && cp -a "$JOURNAL"/. "$SMALL"/ && '
        f'{" ".join(cmd)}; rc=$?; find "$SMALL" -path "*/training/*" -o -path "*/policy*"; exit $rc'
    )
    out = run_waiting(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", inside],
        waiting_for="the update on a 300 MB filesystem to refuse",
        timeout=UPDATE_S,
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SMALL": str(journal_log.parent / "small"),
            "JOURNAL": str(journal_log),
        },
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    # 300 MiB less the journal and the dataset; 134.5 M weights x 14 bytes (fp32 output, served copy, Adam's moments)
    assert re.search(r"has 0\.[23]\d GB free, and this update writes about 1\.88 GB there", text), text[-3000:]
    assert "free space there, then run the same command again (nothing was trained" in text
    listed = out.stdout.split()
    assert any(path.endswith("/training/iter_0000/train_config.yaml") for path in listed), listed  # prepared
    assert not any(path.endswith(("train.log", "/output")) or "/policy" in path for path in listed), listed


def wait_for_training(run_dir: Path, training_dir: Path, proc: subprocess.Popen) -> int:
    """Wait until the warm trainer trains (its groups listed, LLaMA-Factory writing the iteration's
    train.log); the pid of its worker."""
    groups, ready = run_dir / "logs/trainer.log.pgid", run_dir / "trainer/ready.json"
    deadline = time.monotonic() + UPDATE_S
    while not (
        ready.exists()
        and groups.exists()
        and groups.read_text().strip()  # the worker's group (one worker runs without torchrun)
        and "Running training"
        in ((training_dir / "train.log").read_text() if (training_dir / "train.log").exists() else "")
    ):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.5)
    return int(json.loads(ready.read_text())["pid"])


def test_update_only_run_stops_every_training_process_on_sigint_then_resume_trains(
    journal_log: Path, data_dir: Path, tmp_path: Path
) -> None:
    """`run.sh --rl-phase update` on a log path where a rollout run finished iteration 1's train rollout:
    Ctrl+C during the warm trainer's training ends run.sh (exit 130) and leaves no process of it (torchrun's
    workers run in sessions of their own); `--resume`, in fresh processes (BATON_WARM_TRAINER=0), selects
    the successes, passes the fidelity checks (tokens, log-probabilities), trains one optimizer step of a full
    fine-tune and promotes it; a later `--resume` trains iteration 2 from v1's optimizer state."""
    log = tmp_path / "log"
    shutil.copytree(journal_log / "trajectories/train/iter_0000", log / "trajectories/train/iter_0001")
    state = log / "run/state/iter_0001"
    state.mkdir(parents=True)
    (state / "train_rollout.done").write_text("done\n")  # what the rollout run writes when its rollout ends
    base = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data_dir), "--log-path", str(log)]
    small = ["algorithm.per_device_train_batch_size=2", "algorithm.gradient_accumulation_steps=1"]
    small += ["algorithm.cutoff_len=512", "algorithm.warmup_steps=0", "data.logprob_samples=-1"]

    proc = subprocess.Popen(
        [*base, "--rl-phase", "update", "--wait-timeout", "0", "algorithm.max_steps=200", *small],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    )
    wait_for_training(log / "run/rank_0", log / "training/iter_0001", proc)
    proc.send_signal(signal.SIGINT)
    # it stops in seconds (the update gets 15 s to stop its groups, then SIGKILL: docs/cli.md); 120 s only
    # catches a run.sh that does not stop (its training would go on for 200 steps)
    out = communicate_waiting(proc, waiting_for="run.sh --rl-phase update to stop after Ctrl+C", timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert processes_mentioning(str(log)) == []
    assert not (log / "policy").exists()

    again = run_waiting(
        [*base, "--rl-phase", "update", "--resume", "--wait-timeout", "0", "algorithm.max_steps=1", *small],
        waiting_for="run.sh --rl-phase update to train one step and promote",
        timeout=UPDATE_S,
        env={**os.environ, "BATON_WARM_TRAINER": "0"},
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    update_log = (log / "run" / "rank_0" / "logs" / "iter_0001.update.log").read_text()
    assert "token fidelity (train, template smollm2)" in update_log, update_log[-3000:]
    # log-probability fidelity on the real rows: the trainer's float32 log-probabilities of the sampled tokens
    # against those vLLM recorded, within what numerics give (vLLM in bf16 on a CPU with native bf16: ~0.03)
    said = r"log-probability fidelity \(train, float32\): (\d+) tokens .* mean \|gap\| ([0-9.]+)"
    gaps = re.findall(said, update_log)
    assert gaps and all(int(tokens) > 0 and float(mean) < WARN_MEAN_GAP for tokens, mean in gaps), update_log[-3000:]
    run_dir = log / "training" / "iter_0001"
    selection = json.loads((run_dir / "selection.json").read_text())
    rows = json.loads((run_dir / "data" / "train.json").read_text())
    assert selection["train_rows"] == len(rows) >= 2 and rows[0]["conversations"][-1]["from"] == "gpt"
    assert "not_successful" in selection["filtered"]
    assert (run_dir / "train_config.yaml").exists() and (run_dir / "train.log").exists()
    assert os.readlink(log / "policy/current") == "v0001"
    assert (state / "update.done").read_text().strip() == "promoted v1"
    record = json.loads((log / "policy" / "v0001" / "baton_policy.json").read_text())
    assert record["version"] == 1 and record["iteration"] == 1 and record["parent"] is None
    assert not (log / "policy" / "v0001" / "training_args.bin").exists()  # no pickles in a policy
    # the fresh path (training.trainer_run under torchrun) wrote the optimizer state the next update starts from
    carried = json.loads((log / "policy" / "v0001" / "optimizer" / "state.json").read_text())
    assert (carried["optimizer_steps"], carried["moments"]) == (1, True) and record["optimizer_state"], carried
    # an update run writes its records to its own file, never to metrics.jsonl (a rollout run's master merges them)
    metrics = [json.loads(line) for line in (log / "metrics" / "update.jsonl").read_text().splitlines()]
    rollout_side = log / "metrics.jsonl"
    assert '"training"' not in (rollout_side.read_text() if rollout_side.exists() else "")
    training = [m for m in metrics if m.get("kind") == "training"][-1]
    assert training["trainer"] == "fresh"
    assert training["steps"] == 1 and len(training["losses"]) == 1 and training["train_samples_per_second"] > 0
    promotions = [m for m in metrics if m.get("kind") == "promotion"]
    assert [m["policy_version"] for m in promotions] == [1]
    assert processes_mentioning(str(log)) == []

    # another --resume once iteration 2 is rolled out continues v1's optimizer state and schedule from disk
    # (a new run.sh, a new trainer: nothing carried in memory), and v2 records both updates' steps
    rolled_out_as(journal_log, log, 2)
    more = run_waiting(
        [*base, "--rl-phase", "update", "--resume", "--wait-timeout", "0", "algorithm.max_steps=1", *small[:-1]],
        waiting_for="run.sh --rl-phase update --resume to train iteration 2 from v1's optimizer state",
        timeout=UPDATE_S,
    )
    assert more.returncode == 0, (more.stdout + more.stderr)[-3000:]
    train_log = (log / "training" / "iter_0002" / "train.log").read_text()
    said = f"carry from {log}/policy/v0001/optimizer: 1 optimizer steps before this update"
    assert said in train_log, train_log[-3000:]
    carried = json.loads((log / "policy" / "v0002" / "optimizer" / "state.json").read_text())
    assert (carried["optimizer_steps"], carried["moments"]) == (2, True), carried
    assert processes_mentioning(str(log)) == []

    # the backstop: a template behind the update-check's back (chatml renders no system prompt where SmolLM2's
    # template inserts one) in the training YAML, and the token-fidelity check on these real rows refuses it
    recipe = (run_dir / "train_config.yaml").read_text()
    assert "template: smollm2" in recipe, recipe
    edited = re.sub(r"(?m)^(template|default_system):.*\n", "", recipe) + "template: chatml\n"
    (run_dir / "train_config.yaml").write_text(edited)
    out = run_waiting(
        [env_python("train"), "-m", "training.fidelity", str(run_dir / "train_config.yaml")],
        waiting_for="the token-fidelity check of a chatml YAML",
        timeout=UPDATE_S,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "token fidelity: dataset row" in text and "differs from the sampled ids at position" in text
    assert "sampled by the policy: id" in text and "LLaMA-Factory trains:  id" in text


def test_the_warm_trainer_lets_go_of_a_deepspeed_training_under_zero_2_and_3() -> None:
    """The warm trainer's worker runs training.warm.release_memory after each job. DeepSpeed kept every training
    alive in the process: ZeRO's hooks on the gradient accumulators, ZeRO-3's module stack and a cache keyed by
    module. On an H200 the worker then held 3.4 GiB of GPU memory after a ZeRO-2 update and 2.5 GiB after a
    ZeRO-3 one, so the memory guard ended it and the second update failed (docs/benchmarks.md §5b). Here real
    DeepSpeed trainings (gloo, on the CPU) leave no model and no tensor behind."""
    result = train_script_result(
        "tests/e2e/deepspeed_release.py", "2", "3", waiting_for="two DeepSpeed trainings in one process, each released"
    )
    for stage in ("2", "3"):
        assert not result[stage]["model_alive"] and result[stage]["tensors_alive_mib"] < 1, (stage, result)


def rolled_out_as(journal_log: Path, log: Path, iteration: int) -> None:
    """What a rollout run leaves when its train rollout of `iteration` ends (an update run takes the newest)."""
    name = f"iter_{iteration:04d}"
    shutil.copytree(journal_log / "trajectories/train/iter_0000", log / "trajectories/train" / name)
    (log / "run/state" / name).mkdir(parents=True)
    (log / "run/state" / name / "train_rollout.done").write_text("done\n")


def test_warm_trainer_trains_a_grpo_lora_under_deepspeed_twice_in_one_process_and_merges_it_there(
    journal_log: Path, data_dir: Path, tmp_path: Path
) -> None:
    """A second DeepSpeed training in one process failed (`Group ... is not registered`: LLaMA-Factory destroys the
    process group DeepSpeed keeps groups of). Two grpo updates of a LoRA under ZeRO-2 in one warm trainer: both
    train with the policy-gradient loss and are promoted (v1, v2), the same worker trains both, each LoRA is
    merged in that process, with no `llamafactory-cli export` started, and the second continues the first's
    schedule (a LoRA's moments start afresh: docs/update.md). The ratio is formed against the trainer's own
    log-probabilities, recomputed before each update (old_logprobs=trainer): the second update trains v1 on the
    base model's samples, so its first step's ratio is 1 though vLLM's log-probabilities are another policy's, and
    that difference is the importance weight."""
    log = tmp_path / "log"
    rolled_out_as(journal_log, log, 1)
    base = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data_dir), "--log-path", str(log)]
    args = ["algorithm.per_device_train_batch_size=2", "algorithm.gradient_accumulation_steps=1"]
    args += ["algorithm.cutoff_len=512", "algorithm.warmup_steps=0", "algorithm.selection.last_k_iterations=3"]
    args += ["algorithm.max_steps=1", "algorithm.finetuning_type=lora", "launch.deepspeed=zero2", "algorithm=grpo"]
    # a LoRA step large enough that v1 is not the base model that sampled the rollout
    args += ["algorithm.policy_gradient.old_logprobs=trainer", "algorithm.learning_rate=1e-3"]
    proc = subprocess.Popen(
        [*base, "--rl-phase", "update", "--wait-timeout", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    )
    wait_for_training(log / "run/rank_0", log / "training/iter_0001", proc)
    rolled_out_as(journal_log, log, 2)  # handed over while iteration 1 trains: the run takes it next
    out = communicate_waiting(proc, waiting_for="run.sh --rl-phase update to train twice", timeout=3 * UPDATE_S)
    assert proc.returncode == 0, out[-3000:]
    for iteration in (1, 2):
        done = (log / f"run/state/iter_{iteration:04d}/update.done").read_text().strip()
        assert done == f"promoted v{iteration}", (iteration, out[-3000:])
        recipe = (log / f"training/iter_{iteration:04d}/train_config.yaml").read_text()
        assert "finetuning_type: lora" in recipe and "deepspeed:" in recipe
        update_log = (log / f"run/rank_0/logs/iter_{iteration:04d}.update.log").read_text()
        assert "the LoRA merged in this process" in update_log, update_log[-3000:]
        assert "baton_policy_gradient" in recipe
        carried = json.loads((log / f"policy/v{iteration:04d}/optimizer/state.json").read_text())
        assert (carried["optimizer_steps"], carried["moments"]) == (iteration, False), carried
    train_log = (log / "training/iter_0002/train.log").read_text()
    assert "grpo: the policy-gradient loss with" in train_log
    said = f"carry from {log}/policy/v0001/optimizer: 1 optimizer steps before this update"
    assert said in train_log and "a LoRA trains a new adapter each update" in train_log, train_log[-3000:]
    metrics = [json.loads(line) for line in (log / "metrics/update.jsonl").read_text().splitlines()]
    trainers = [m["trainer"] for m in metrics if m.get("kind") == "training"]
    assert len(trainers) == 2 and trainers[0] == trainers[1] and trainers[0].startswith("warm:"), trainers
    # max_steps=1 of 2 rows: only those are rescored, not the whole selection
    rescored = "the old log-probabilities of 2 of "
    assert rescored in train_log and "recomputed by the trainer" in train_log, train_log[-3000:]
    first, second = (m["pg"] for m in metrics if m.get("kind") == "training")
    print(f"old_logprobs=trainer: first update {first}, second {second}")
    # both ratios are the trainer's own, 1 before the first step: the first update's though its numerics differ
    # from vLLM's (a LoRA's base computes in the checkpoint's bf16, vLLM here in float32: docs/update.md), the
    # second's though vLLM's log-probabilities are the base model's and it trains v1
    for pg in (first, second):
        assert abs(pg["ratio"][0] - 1) < 1e-4 and pg["logprob_gap"][0] > 1e-3, pg
    # the difference is the importance weight instead: numerics only in the first, no weight at the cap
    assert first["logprob_gap"][0] < WARN_MEAN_GAP and first["tis_capped"] == [0.0], first
    assert first["tis_weight"][0] != 1.0 and abs(first["tis_weight"][0] - 1) < 0.05, first
    # nothing of an update stays alive in the trainer after it: a DeepSpeed engine's hooks kept its model and
    # optimizer (4 GiB after a full ZeRO-2 update of this model; on a GPU the memory vLLM wakes into)
    report = json.loads((Layout(log).trainer_dir(0) / done_name(0)).read_text())
    assert report["seq"] >= 2 and report["tensors_alive_mib"] < 1, report
    assert processes_mentioning(str(log)) == []
