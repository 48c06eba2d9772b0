"""coordinator/driver/trainer.py and update.update_node: one warm trainer takes every update of a run; an update it
died in fails and the next starts a new one; one that cannot start sends the run's updates to fresh processes.

The train interpreter runs tests/unit/driver/fake_warm_trainer.py (training/warm.py's files, no training); the
groups, waits and files are the driver's own. tests/e2e/test_update.py runs the real trainer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coordinator.driver import say, trainer
from coordinator.driver import update as update_module
from coordinator.driver.context import Run
from coordinator.driver.nodes import Synced
from coordinator.driver.procs import group_alive
from coordinator.driver.trainer import WarmTrainer, nproc_of
from coordinator.driver.update import check_start, check_wait, end_failed_trainers, stop_update, update_node
from rollout_engine.exits import Exit
from tests.unit.driver.fakes import Runs
from training.warm import FRESH, Placement

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


def test_a_job_that_leaves_tensors_alive_in_the_trainer_is_said_and_the_trainer_kept(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker's report of what stayed after the job (tensors_alive_mib): above 256 MiB the driver says so, since
    on a CPU nothing else notices; the update stands and the trainer takes the next one."""
    assert update(run, "iteration=1", "fake.keep=255") == 0
    assert "still holds" not in capsys.readouterr().err
    assert update(run, "iteration=2", "fake.keep=844.2") == 0
    assert (
        f"[baton] warning: the warm trainer still holds 844 MiB of tensors after this update ({run.run_dir}/trainer/"
        "done.<rank>.json): something the training made is still referenced (an objective that keeps its tensors?), "
        "and each update may add to it; BATON_WARM_TRAINER=0 trains every update in fresh processes (docs/update.md)"
    ) in capsys.readouterr().err
    assert update(run, "iteration=3") == 0
    assert len({job[0] for job in jobs(run)}) == 1


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


TWO = Placement(1, nnodes=2, node_rank=0, master_addr="127.0.0.2", master_port=29555)


def ready_pid(run: Run) -> int:
    return json.loads((run.run_dir / "trainer" / "ready.json").read_text())["pid"]


def test_several_nodes_the_masters_plan_keeps_the_running_generation_and_starts_a_new_one_when_the_nodes_change(
    run: Run,
) -> None:
    warm = WarmTrainer(run)
    assert warm.plan(TWO) == (1, True)  # none running yet
    assert warm.join(1, True, TWO)
    first = ready_pid(run)
    assert warm.plan(TWO) == (1, False)
    assert warm.job(["phase=train"], run.run_dir / "logs" / "update.log") == 0
    assert warm.plan(TWO) == (1, False)
    alone = Placement(1, nnodes=1, node_rank=0, master_addr="127.0.0.2", master_port=29555)  # continue mode
    assert warm.plan(alone) == (2, True)
    assert warm.join(2, True, alone) and ready_pid(run) != first


def test_several_nodes_a_node_whose_trainer_ended_since_fails_the_update_at_once_and_starts_none(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its partners' trainers are still the old generation's: a new one here could never join them."""
    warm = WarmTrainer(run)
    assert warm.join(1, True, TWO)
    assert warm.job(["phase=train", "fake.die"], run.run_dir / "logs" / "update.log") == Exit.FAILED
    assert not warm.join(1, False, TWO)
    assert "this node's warm trainer is not running (generation 1 expected" in capsys.readouterr().err
    assert run.groups.recorded("trainer") is None
    assert warm.join(2, True, TWO)  # the master's next plan: a new generation


def test_several_nodes_the_master_plans_fresh_processes_when_warm_trainer_is_0_or_its_trainer_did_not_start(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = WarmTrainer(run)
    monkeypatch.setenv("BATON_WARM_TRAINER", "0")
    assert warm.plan(TWO) is None
    monkeypatch.setenv("BATON_WARM_TRAINER", "1")
    monkeypatch.setenv("FAKE_TRAINER_START", "exit")
    assert not warm.join(1, True, TWO)
    assert warm.plan(TWO) is None


@pytest.mark.parametrize(
    ("synced", "kept"),
    [
        (Synced({0: {"train_exit": 0, "exit": 3}, 1: {"train_exit": 0}}), True),
        (Synced({0: {"train_exit": 1}, 1: {"train_exit": 0}}), False),
        (Synced({0: {"train_exit": 0}, 1: {"train_exit": "143"}}), False),
        (Synced({0: {"train_exit": 0}}, gone=[1]), False),
    ],
)
def test_a_training_that_failed_on_any_node_or_a_rank_gone_ends_this_nodes_trainer(
    run: Run, synced: Synced, kept: bool
) -> None:
    run.trainer = WarmTrainer(run)
    assert run.trainer.join(1, True, TWO)
    end_failed_trainers(run, synced)
    assert run.trainer.running() == kept


def test_a_job_whose_trainer_is_stopped_from_a_watch_fails_at_once(run: Run) -> None:
    """What a partner's failed part does on several nodes (Node.watch_partners -> stop_update): this node's
    worker may wait in a collective for good; the job ends with the trainer."""
    warm = WarmTrainer(run)
    run.trainer = warm
    assert warm.join(1, True, TWO)
    run.supervisor.add(lambda: stop_update(run) if (run.run_dir / "trainer" / "started.json").exists() else None)
    assert warm.job(["phase=train", "fake.hang"], run.run_dir / "logs" / "update.log") == Exit.FAILED
    assert run.groups.recorded("trainer") is None and not warm.running()


def test_a_trainer_stopped_from_a_watch_while_it_starts_fails_the_update_but_the_run_stays_warm(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partner's part failed while this node waited for the process group (its trainer never ready): that is
    not a trainer that cannot start, so the master's next plan is a new generation, not fresh processes."""
    monkeypatch.setenv("FAKE_TRAINER_START", "hang")
    warm = WarmTrainer(run)
    run.trainer = warm
    run.supervisor.add(lambda: stop_update(run) if run.groups.group("trainer") is not None else None)
    assert not warm.join(1, True, TWO)
    assert not warm.given_up and warm.plan(TWO) == (2, True)
    assert run.groups.recorded("trainer") is None


def checkout(tmp_path: Path) -> Path:
    """A checkout's training code and configs, as code_digest reads them."""
    root = tmp_path / "checkout"
    (root / "training" / "__pycache__").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "training" / "pg_loss.py").write_text("CLIP = 0.2\n")
    (root / "configs" / "update.yaml").write_text("learning_rate: 1.0e-6\n")
    return root


def test_an_update_after_the_training_code_or_configs_changed_starts_a_new_trainer(
    run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer imported the code when it started: an edited loss or recipe would not be in its processes."""
    run.root = str(checkout(tmp_path))
    training = Path(run.root, "training")
    assert update(run, "iteration=1") == 0
    (training / "__pycache__" / "pg_loss.cpython-311.pyc").write_bytes(b"\0")  # not code it reads
    (training / "notes.txt").write_text("a user's notes")
    assert update(run, "iteration=2") == 0
    (training / "pg_loss.py").write_text("CLIP = 0.3\n")
    assert update(run, "iteration=3") == 0
    (training / "pg_loss.py").rename(training / "loss.py")  # the same bytes under another name
    assert update(run, "iteration=4") == 0
    Path(run.root, "configs", "update.yaml").write_text("learning_rate: 3.0e-5\n")
    assert update(run, "iteration=5") == 0

    pids = [job[0] for job in jobs(run)]
    assert pids[0] == pids[1] and len(set(pids[1:])) == 4
    said = "warm trainer: the training code or configs changed since it started; starting a new one"
    assert capsys.readouterr().err.count(said) == 3
    assert [group_alive(int(pid)) for pid in dict.fromkeys(pids)] == [False, False, False, True]  # old ones stopped


def test_several_nodes_the_masters_plan_starts_a_new_generation_when_the_code_changed(run: Run, tmp_path: Path) -> None:
    run.root = str(checkout(tmp_path))
    warm = WarmTrainer(run)
    assert warm.join(1, True, TWO)
    assert warm.plan(TWO) == (1, False)
    Path(run.root, "training", "pg_loss.py").write_text("CLIP = 0.3\n")
    assert warm.plan(TWO) == (2, True)
    assert warm.join(2, True, TWO) and warm.plan(TWO) == (2, False)


# --- a single node's trainer starts with the run, and on a CPU takes the update-check -------------------------


def check_then_update(run: Run, *argv: str) -> int:
    """The start of a run as steps() drives it (the check beside vLLM's start-up), then iteration 1's update."""
    check_wait(run, check_start(run, 1))
    return update(run, "iteration=1", *argv)


def test_a_single_node_starts_its_trainer_with_the_run_and_on_a_cpu_the_check_is_its_first_job(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(update_module, "device", lambda: "cpu")
    run.composed.update = ["algorithm=rft"]
    assert check_then_update(run) == 0

    err = capsys.readouterr().err
    assert err.index("warm trainer: starting") < err.index("update-check: handed to the warm trainer")
    assert err.count("warm trainer: starting") == 1 and "update-check: started" not in err
    assert "update-check: the update configuration is accepted" in err
    taken = jobs(run)
    assert [job[0] for job in taken] == [taken[0][0]] * 2  # one process: the check, then the update
    assert "phase=check" in taken[0] and taken[0][-1] == "algorithm=rft"
    assert taken[1][1:] == [f"log_path={run.log}", "iteration=1"]
    assert (run.run_dir / "update-check.ok").is_file()


def test_on_a_gpu_the_check_keeps_a_process_of_its_own_beside_the_trainer_started_with_the_run(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(update_module, "device", lambda: "cuda")
    assert check_then_update(run) == 0
    err = capsys.readouterr().err
    assert err.index("warm trainer: starting") < err.index("update-check: started") < err.index("update: handed")
    assert err.count("warm trainer: starting") == 1
    assert [job[1:] for job in jobs(run)] == [[f"log_path={run.log}", "iteration=1"]]


def test_a_check_the_trainer_rejects_ends_the_run_with_exit_2_and_one_that_cannot_start_checks_in_a_process(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(update_module, "device", lambda: "cpu")
    run.composed.update = [f"fake.exit={Exit.BAD_INPUT}"]
    with pytest.raises(say.Die) as caught:
        check_wait(run, check_start(run, 1))
    assert caught.value.code == Exit.BAD_INPUT
    assert "the update would reject this configuration" in caught.value.message
    run.trainer.stop()
    capsys.readouterr()

    run.trainer = None
    run.composed.update = []
    monkeypatch.setenv("FAKE_TRAINER_START", "exit")
    assert check_then_update(run) == 0
    err = capsys.readouterr().err
    assert "the warm trainer exited; the update-check and this run's updates run in fresh processes" in err
    assert "update-check: started" in err and err.count("warm trainer: starting") == 1  # not tried again
    assert (run.run_dir / "logs" / "update.log").read_text().startswith("fresh update:")


def test_a_trainer_that_dies_in_the_check_leaves_it_to_a_process_of_its_own_and_the_update_to_a_new_trainer(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(update_module, "device", lambda: "cpu")
    run.composed.update = ["fake.die"]
    check_wait(run, check_start(run, 1))
    err = capsys.readouterr().err
    assert "the warm trainer ended during the update-check" in err and "update-check: started" in err
    assert "update-check: the update configuration is accepted" in err
    assert (run.run_dir / "logs" / "update-check.log").read_text().startswith("fresh update:")
    run.composed.update = []
    assert update(run, "iteration=1") == 0
    assert "warm trainer: starting" in capsys.readouterr().err  # a new one: this run's updates stay warm


def test_a_check_past_its_deadline_in_the_trainer_stops_the_trainer_and_ends_the_run_with_exit_1(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(update_module, "device", lambda: "cpu")
    monkeypatch.setenv("BATON_CHECK_TIMEOUT_S", "2")
    run.composed.update = ["fake.hang"]
    with pytest.raises(say.Die) as caught:
        check_wait(run, check_start(run, 1))
    assert caught.value.code == 1
    assert caught.value.message.startswith("the check of the update configuration did not finish within 2s")
    assert run.groups.recorded("trainer") is None and not run.trainer.alive()
