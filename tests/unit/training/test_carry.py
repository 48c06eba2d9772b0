"""The optimizer state carried from one update to the next (training.carry): HF's Trainer with the carry callback,
run in the train environment by carry_cases.py (its docstring: the cases), and the plan a recipe gets."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, env_python
from training.carry import STATE, Plan, plan_for, read_state


def run_cases(folder: Path, *how: str) -> dict:
    out = subprocess.run(
        [env_python("train"), str(REPO / "tests/unit/training/carry_cases.py"), str(folder), *how],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_cases(tmp_path_factory.mktemp("carry"))


@pytest.fixture(scope="module", params=["zero2", "zero3"])
def zero(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same cases under DeepSpeed ZeRO-2 and ZeRO-3 (one rank on the CPU)."""
    return {
        "stage": request.param,
        **run_cases(tmp_path_factory.mktemp("carry-" + request.param), request.param, str(free_port())),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_trainings_carried_end_where_one_uninterrupted_training_ends(cases: dict) -> None:
    assert cases["carried"] == pytest.approx(cases["whole"], abs=1e-7)
    # the same second training without the carried state ends elsewhere: the test can tell the two apart
    assert max(abs(a - b) for a, b in zip(cases["afresh"], cases["whole"], strict=True)) > 1e-3


def test_under_deepspeed_zero_two_trainings_carried_end_where_one_ends_too(zero: dict) -> None:
    """ZeRO keeps Adam's state in flat partitions (stage 3 in one per sub-group, beside partitioned weights),
    filled and read per parameter through DeepSpeed's accessors: the same file format, the same exact
    continuation (both of HF's parameter groups: with and without decay)."""
    want = {"zero2": "DeepSpeedZeroOptimizer", "zero3": "DeepSpeedZeroOptimizer_Stage3"}[zero["stage"]]
    assert zero["optimizer"] == want
    assert zero["carried"] == pytest.approx(zero["whole"], abs=1e-7)
    assert max(abs(a - b) for a, b in zip(zero["afresh"], zero["whole"], strict=True)) > 1e-3
    assert zero["states"]["second"]["parameters"] == 2 and zero["lrs"]["second"] == pytest.approx(
        zero["lrs"]["whole"][2:]
    )


def test_the_warmup_continues_across_trainings_and_the_step_count_adds_up(cases: dict) -> None:
    lrs = cases["lrs"]
    assert lrs["first"] + lrs["second"] == pytest.approx(lrs["whole"])
    assert lrs["third"] == pytest.approx(lrs["second"])  # the schedule carries without the moments too
    assert [cases["states"][name]["optimizer_steps"] for name in ("first", "second", "third")] == [2, 5, 5]


def test_moments_are_saved_only_when_they_carry(cases: dict) -> None:
    assert cases["files"]["first"] == sorted([STATE, "moments.safetensors"])
    assert cases["states"]["first"]["parameters"] == 2  # the weight and the bias
    assert cases["files"]["third"] == [STATE]
    assert cases["states"]["third"]["moments"] is False


def test_a_recipe_loads_the_state_of_the_version_it_trains_from_when_there_is_one(tmp_path: Path) -> None:
    version = tmp_path / "v0001"
    (version / "optimizer").mkdir(parents=True)
    out = tmp_path / "output" / "optimizer"
    assert Plan.of(plan_for(version, out, "full")) == Plan("", str(out), True)  # no state.json yet
    (version / "optimizer" / STATE).write_text(
        json.dumps({"format": 1, "optimizer_steps": 7, "lr_scheduler_type": "constant", "moments": True})
    )
    assert Plan.of(plan_for(version, out, "lora")) == Plan(str(version / "optimizer"), str(out), False)
    assert read_state(version / "optimizer").optimizer_steps == 7


def test_a_state_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / STATE).write_text(json.dumps({"format": 2, "optimizer_steps": 1}))
    with pytest.raises(ValueError, match="format 2; this Baton reads format 1"):
        read_state(tmp_path)
