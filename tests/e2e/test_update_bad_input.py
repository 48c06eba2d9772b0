"""Bad input to `python -m training`: one clear error, exit 2, nothing written; too little data to train
on: exit 3, nothing written (train environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_engine.layout import Layout
from tests.conftest import REPO
from tests.e2e.conftest import processes_mentioning, run_update
from tests.unit.training.trajectories import traj
from tests.waits import UPDATE_S, run_waiting

pytestmark = pytest.mark.e2e


def write_journal(log: Path, trajectories, iteration: int = 0) -> None:
    directory = Layout(log).iteration_dir("train", iteration)
    directory.mkdir(parents=True)
    (directory / "rank_0.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories))


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_no_trajectories(tmp_path: Path, model_dir: Path) -> None:
    out = run_update(tmp_path / "log", f"model_path={model_dir}")
    assert out.returncode == 3 and "no train trajectories in" in out.stderr + out.stdout
    assert not (tmp_path / "log").exists()


def test_no_usable_samples_names_each_rule(tmp_path: Path, model_dir: Path) -> None:
    log = tmp_path / "log"
    write_journal(log, [traj("a", 0, False), traj("a", 1, False), traj("b", 0, True, turns=[])])
    before = listing(log)
    out = run_update(log, f"model_path={model_dir}")
    text = out.stderr + out.stdout
    assert out.returncode == 3, text[-2000:]
    assert "no usable samples for algorithm rft: 0 samples from 3 trajectories" in text
    assert "empty: 1" in text and "not_successful: 2" in text
    assert listing(log) == before


def test_missing_model_and_inconsistent_batch(tmp_path: Path) -> None:
    out = run_update(tmp_path / "log", f"model_path={tmp_path / 'nope'}", "algorithm.per_device_train_batch_size=0")
    text = out.stderr + out.stdout
    assert out.returncode == 2 and "config.json missing" in text
    assert "algorithm.per_device_train_batch_size must be >= 1 (got 0)" in text


def test_batch_larger_than_the_samples(tmp_path: Path, model_dir: Path) -> None:
    log = tmp_path / "log"
    write_journal(log, [traj("a", 0, True)])
    out = run_update(log, f"model_path={model_dir}", "algorithm.per_device_train_batch_size=4")
    assert out.returncode == 3 and "1 training rows cannot fill one optimizer step" in out.stderr + out.stdout
    assert not (log / "training").exists()


def test_unknown_algorithm(tmp_path: Path) -> None:
    # (a template LLaMA-Factory lacks, or one that does not render the model: test_llamafactory_check.py)
    out = run_update(tmp_path / "log", "algorithm=ppo")
    assert out.returncode == 2 and "algorithm" in out.stderr and "rft" in out.stderr


def test_run_sh_rejects_a_template_in_its_trainers_check_and_records_an_update_with_nothing_to_train_on_as_skipped(
    tmp_path: Path, data_dir: Path
) -> None:
    log = tmp_path / "log"
    write_journal(log, [traj("a", 0, False, iteration=1), traj("a", 1, False, iteration=1)], iteration=1)
    state = log / "run" / "state" / "iter_0001"
    state.mkdir(parents=True)
    (state / "train_rollout.done").write_text("done\n")
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data_dir), "--log-path", str(log)]
    # on a CPU the update-check is the first job of the warm trainer the run starts at once: its rejection is
    # exit 2 with the report, and the trainer's processes are gone
    out = run_waiting(
        [*cmd, "--rl-phase", "update", "--wait-timeout", "0", "model_config.template=nonsense"],
        waiting_for="run.sh --rl-phase update's update-check in its warm trainer",
        timeout=UPDATE_S,
    )
    assert out.returncode == 2, (out.stdout + out.stderr)[-3000:]
    assert "update-check: handed to the warm trainer" in out.stderr
    assert "the update would reject this configuration" in out.stderr
    assert "\nmodel_config.template='nonsense' is not a LLaMA-Factory template; one of: smollm2," in out.stderr
    assert not (state / "update.done").exists() and processes_mentioning(str(log)) == []
    # iteration 1's train rollout finished without a success: run.sh keeps the policy and goes on (exit 0)
    out = run_waiting(
        [*cmd, "--rl-phase", "update", "--wait-timeout", "0"],
        waiting_for="run.sh --rl-phase update to skip an iteration with nothing to train on",
        timeout=UPDATE_S,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert (state / "update.done").read_text().strip() == "skipped: too little to train on"
    why = "no usable samples for algorithm rft: 0 samples from 2 trajectories; filtered out by rule: not_successful: 2"
    assert f"iteration 1: nothing to train on ({why}; log: " in out.stderr, out.stderr[-3000:]
    assert not (log / "policy").exists() and not (log / "training" / "iter_0001" / "data").exists()


def test_a_setting_the_trainer_refuses_while_it_trains_is_bad_input(tmp_path: Path, model_dir: Path) -> None:
    """learning_rate=-1 handed to LLaMA-Factory directly (algorithm.llamafactory_overrides, which neither the
    schema nor LLaMA-Factory's parser checks): torch's optimizer refuses it once the training has started. No
    retry mends that: exit 2 naming the setting, its value and the fix, not 1 (issue 26)."""
    log = tmp_path / "log"
    write_journal(log, [traj("a", 0, True)])
    out = run_update(
        log,
        f"model_path={model_dir}",
        "data.fidelity_samples=0",
        "algorithm.per_device_train_batch_size=1",
        "algorithm.gradient_accumulation_steps=1",
        "+algorithm.llamafactory_overrides.learning_rate=-1",
    )
    text = out.stderr + out.stdout
    assert out.returncode == 2, text[-3000:]
    assert "Invalid learning rate: -1" in text and "field: algorithm.learning_rate=-1" in text, text[-3000:]
    assert not (log / "policy").exists()
