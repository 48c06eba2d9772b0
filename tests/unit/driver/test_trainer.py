"""coordinator/driver/trainer.py and update.update_node: one warm trainer takes every update of a run; an update it
died in fails and the next starts a new one; one that cannot start sends the run's updates to fresh processes.

The train interpreter runs tests/unit/driver/fake_warm_trainer.py (training/warm.py's files, no training); the
groups, waits and files are the driver's own. tests/e2e/test_update.py runs the real trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coordinator.driver import trainer
from coordinator.driver.context import Run
from coordinator.driver.procs import group_alive
from coordinator.driver.trainer import nproc_of
from coordinator.driver.update import update_node
from rollout_engine.exits import Exit
from tests.unit.driver.fakes import Runs
from training.warm import FRESH

FAKE = Path(__file__).with_name("fake_warm_trainer.py")


@pytest.fixture
def run(runs: Runs, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("BATON_WARM_TRAINER", "1")
    made = runs.make()
    runs.fake_python(made, "train", f'exec {sys.executable} {FAKE} "$@"')
    return made


def update(run: Run, *argv: str) -> int:
    cmd = [run.pythons.train, "-m", "training", "--config-name", "update", f"log_path={run.log}", *argv]
    return update_node(run, cmd, run.run_dir / "logs" / "update.log")


def jobs(run: Run) -> list[list[str]]:
    """Each job the trainer took: [pid, argv...]."""
    return [line.split() for line in (run.run_dir / "trainer" / "jobs.log").read_text().splitlines()]


def test_one_trainer_takes_every_update_with_python_m_trainings_arguments_and_its_exit_codes(run: Run) -> None:
    assert update(run, "iteration=1") == 0
    assert update(run, "iteration=2", f"fake.exit={Exit.NOTHING_TO_TRAIN}") == Exit.NOTHING_TO_TRAIN
    assert update(run, "iteration=3", f"fake.exit={Exit.BAD_INPUT}") == Exit.BAD_INPUT

    taken = jobs(run)
    assert [job[1:] for job in taken] == [
        [f"log_path={run.log}", "iteration=1"],
        [f"log_path={run.log}", "iteration=2", f"fake.exit={Exit.NOTHING_TO_TRAIN}"],
        [f"log_path={run.log}", "iteration=3", f"fake.exit={Exit.BAD_INPUT}"],
    ]
    assert len({job[0] for job in taken}) == 1  # one process took all three
    assert (run.run_dir / "logs" / "update.log").read_text() == f"update job 3: exit {Exit.BAD_INPUT}\n"


def test_an_update_the_trainer_died_in_fails_and_the_next_starts_a_new_trainer(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert update(run, "iteration=1") == 0
    first = run.groups.recorded("trainer")

    assert update(run, "iteration=2", "fake.die") == Exit.FAILED
    assert "the warm trainer ended during the update" in capsys.readouterr().err
    assert run.groups.recorded("trainer") is None and not group_alive(first[0])

    assert update(run, "iteration=3") == 0
    pids = [job[0] for job in jobs(run)]
    assert pids[0] == pids[1] != pids[2]


@pytest.mark.parametrize("start", ["exit", "hang"])
def test_a_trainer_that_does_not_start_sends_this_runs_updates_to_fresh_processes(
    run: Run, start: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_TRAINER_START", start)
    monkeypatch.setenv("BATON_TRAINER_START_S", "2")

    assert update(run, "iteration=1") == 0
    assert update(run, "iteration=2") == 0

    err = capsys.readouterr().err
    why = "exited" if start == "exit" else "was not ready within 2s (BATON_TRAINER_START_S)"
    assert err.count(f"the warm trainer {why}; this run's updates run in fresh processes") == 1
    assert err.count("warm trainer: starting") == 1  # not tried again
    assert run.groups.recorded("trainer") is None
    logged = (run.run_dir / "logs" / "update.log").read_text().splitlines()
    assert [line.split()[-1] for line in logged] == ["iteration=1", "iteration=2"]  # the fresh `python -m training`


def test_stop_ends_the_trainer_group(run: Run) -> None:
    assert update(run, "iteration=1") == 0
    pgid = run.groups.recorded("trainer")[0]
    run.trainer.stop()
    assert not group_alive(pgid) and run.groups.recorded("trainer") is None


def test_warm_trainer_0_runs_every_update_fresh(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_WARM_TRAINER", "0")
    assert update(run, "iteration=1") == 0
    assert run.trainer is None and not (run.run_dir / "trainer").exists()
    assert (run.run_dir / "logs" / "update.log").read_text().startswith("fresh update:")


def test_an_update_of_another_layout_than_the_trainers_runs_fresh_and_so_do_the_later_ones(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert update(run, "iteration=1", f"fake.exit={FRESH}") == 0  # the fake's fresh `python -m training`
    assert update(run, "iteration=2") == 0
    assert "the warm trainer cannot run this update's layout" in capsys.readouterr().err
    assert len(jobs(run)) == 1 and run.groups.recorded("trainer") is None
    logged = (run.run_dir / "logs" / "update.log").read_text().splitlines()
    assert logged[-2:] == [
        f"fresh update: -m training --config-name update log_path={run.log} iteration=1 fake.exit={FRESH}",
        f"fresh update: -m training --config-name update log_path={run.log} iteration=2",
    ]


def test_the_trainer_starts_with_the_workers_the_updates_overrides_ask_for() -> None:
    assert nproc_of(["iteration=1"]) == 0
    assert nproc_of(["launch.nproc_per_node=2", "x=1", "launch.nproc_per_node=4"]) == 4


def test_a_trainer_that_hangs_past_the_jobs_timeout_is_stopped_and_the_update_fails(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trainer, "GRACE_S", 1)
    assert update(run, "iteration=1") == 0
    pgid = run.groups.recorded("trainer")[0]

    assert update(run, "iteration=2", "launch.timeout_s=1", "fake.hang") == Exit.FAILED

    assert "training exceeded 1 s (launch.timeout_s) and 1 s more; stopping the warm trainer" in capsys.readouterr().err
    assert not group_alive(pgid) and run.groups.recorded("trainer") is None
    assert update(run, "iteration=3") == 0  # a new trainer
