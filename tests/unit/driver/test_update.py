"""coordinator/driver/update.py: the update-check beside vLLM's start-up, one node's update and what its exit
code decides, and stopping a running update so that its training groups end too.

`python -m training` is a fake train interpreter (a bash script printing what the test gives and exiting with
the test's code); tests/e2e runs the real check and update. The groups, the waits, the markers and the records
are the driver's own, on the test's log path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator import groupfile, runstate
from coordinator.driver import say
from coordinator.driver.context import Run
from coordinator.driver.procs import group_alive, start_time
from coordinator.driver.update import check_problems, check_start, check_wait, stop_update, update, update_cmd
from rollout_engine.layout import GROUPS_NAME
from tests.unit.driver.fakes import Runs, running

# --- the command ---


def test_the_update_is_told_the_dtype_this_nodes_vllm_computes_in_and_a_users_setting_comes_after_it(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = runs.make()
    for forced in ("float32", "bfloat16"):
        monkeypatch.setenv("BATON_VLLM_DTYPE", forced)
        assert f"promotion.served_dtype={forced}" in update_cmd(run, 1, "train")
    run.composed.update = ["promotion.dtype=bfloat16"]
    cmd = update_cmd(run, 1, "train")
    assert cmd.index("promotion.dtype=bfloat16") > cmd.index("promotion.served_dtype=bfloat16")


# --- the update-check ----------------------------------------------------------------------------------------


class Check:
    """A run whose train interpreter answers phase=check with the output and exit code set by `exits`."""

    def __init__(self, runs: Runs, **args: object) -> None:
        self.run = runs.make(**args)
        self.out, self.rc = runs.tmp / "check.out", runs.tmp / "check.rc"
        runs.fake_python(self.run, "train", f'printf "$(cat {self.out})"; exit "$(cat {self.rc})"')
        self.log = self.run.run_dir / "logs" / "update-check.log"
        self.exits(0, "")

    def exits(self, code: int, output: str) -> None:
        self.rc.write_text(f"{code}\n")
        self.out.write_text(output)

    def __call__(self) -> None:
        """Start the check and wait for it, as steps() does around vLLM's start-up."""
        check_wait(self.run, check_start(self.run, 1))


@pytest.fixture
def check(runs: Runs) -> Check:
    return Check(runs)


def test_a_rejected_check_ends_the_run_with_exit_2_and_the_report_after_its_last_bad_config(
    check: Check, capsys: pytest.CaptureFixture[str]
) -> None:
    check.exits(2, r"update: iteration 1\nbad input:\nold\nbad config:\ntemplate=x is wrong; use smollm2\nsecond\n")
    with pytest.raises(say.Die) as caught:
        check()
    assert caught.value.code == 2
    assert caught.value.message == (
        "the update would reject this configuration (checked in the train environment before any rollout; "
        f"log: {check.log}):\ntemplate=x is wrong; use smollm2\nsecond"
    )
    assert capsys.readouterr().err == f"[baton] update-check: started (log: {check.log})\n"
    assert check.run.groups.recorded("update-check") is None


def test_an_accepted_check_goes_on_and_a_failed_one_ends_the_run_with_exit_1_and_its_log_s_last_lines(
    check: Check, capsys: pytest.CaptureFixture[str]
) -> None:
    check.exits(0, r"fine\n")
    check()
    assert "[baton] update-check: the update configuration is accepted (" in capsys.readouterr().err
    check.run.composed.update = ["another=command"]  # a check with another key: it runs
    check.exits(1, r"Traceback\nImportError: no torch\n")
    with pytest.raises(say.Die) as caught:
        check()
    assert caught.value.code == 1
    assert caught.value.message == (
        f"the check of the update configuration failed (exit 1; last lines of {check.log} above)"
    )
    assert capsys.readouterr().err.endswith("Traceback\nImportError: no torch\n")
    assert check.log.read_text() == "Traceback\nImportError: no torch\n"  # this run's output only


def test_a_rollout_run_checks_nothing_and_a_log_without_a_report_shows_its_last_15_lines(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    check = Check(runs, phase="rollout", split="train-only")
    check.exits(2, r"x\n")
    check()
    assert capsys.readouterr().err == ""
    assert not check.log.exists()
    plain = runs.tmp / "plain.log"
    plain.write_text("".join(f"{n}\n" for n in range(1, 21)))
    assert check_problems(plain) == "\n".join(str(n) for n in range(6, 21))


def test_the_report_is_found_after_the_warm_trainers_logger_prefix_too(tmp_path: Path) -> None:
    """The warm trainer logs "[<time> training] bad config:" where a fresh process logs the bare line."""
    log = tmp_path / "update-check.log"
    log.write_text("[2026-11-30 16:27:42,647 training] bad config:\nmodel_config.template='x' is not a template\n")
    assert check_problems(log) == "model_config.template='x' is not a template"


def test_a_check_past_its_deadline_is_stopped_exit_1_naming_the_deadline_its_group_gone(
    check: Check, runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_CHECK_TIMEOUT_S", "2")
    runs.fake_python(check.run, "train", "exec sleep 299.71")
    with pytest.raises(say.Die) as caught:
        check()
    assert caught.value.code == 1
    assert caught.value.message == (
        "the check of the update configuration did not finish within 2s (BATON_CHECK_TIMEOUT_S); stopped it. "
        f"Its log: {check.log}"
    )
    assert check.run.groups.recorded("update-check") is None
    assert not running("sleep 299.71")


def test_a_check_that_passed_is_not_run_again_with_the_same_key_another_command_or_a_rejection_runs(
    check: Check, capsys: pytest.CaptureFixture[str]
) -> None:
    started = "update-check: started"
    check.exits(0, "first")
    check()
    assert started in capsys.readouterr().err and check.log.read_text() == "first"
    check.run.composed.update = ["x=2"]  # another command
    check.exits(0, "second")
    check()
    assert started in capsys.readouterr().err and check.log.read_text() == "second"
    check()  # the same command again: skipped, its log kept
    assert capsys.readouterr().err == (
        "[baton] update-check: passed before with this command, environment and code; not run again\n"
    )
    assert check.log.read_text() == "second"
    check.run.composed.update = ["x=3"]
    check.exits(2, r"bad config:\nx\n")
    for _ in range(2):  # a rejection is never remembered: it runs (and rejects) again
        with pytest.raises(say.Die) as caught:
            check()
        assert caught.value.code == 2 and started in capsys.readouterr().err


# --- one update -----------------------------------------------------------------------------------------------


class Update:
    """An update run (--rl-phase update) whose `python -m training` records its phase and exits with `rc`."""

    def __init__(self, runs: Runs) -> None:
        self.run = runs.make(phase="update", max_failures=3)
        self.rc, self.phases, self.out = runs.tmp / "update.rc", runs.tmp / "phases", runs.tmp / "update.out"
        body = f'for a; do [[ $a != phase=* ]] || echo "$a" >>{self.phases}; done; cat {self.out}; '
        body += f'exit "$(cat {self.rc})"'
        runs.fake_python(self.run, "train", body)
        self.exits(0)

    def exits(self, code: int, output: str = "") -> None:
        self.rc.write_text(f"{code}\n")
        self.out.write_text(output)

    def marker(self, iteration: int) -> str:
        return runstate.load_markers(self.run.log, iteration).get("update", "")

    def log(self, iteration: int) -> Path:
        return self.run.run_dir / "logs" / f"iter_{iteration:04d}.update.log"


@pytest.fixture
def one_update(runs: Runs) -> Update:
    return Update(runs)


def test_exit_2_of_the_update_ends_the_run_at_once_with_exit_2_naming_its_log(one_update: Update) -> None:
    one_update.exits(2)
    with pytest.raises(say.Die) as caught:
        update(one_update.run, 1, False)
    assert caught.value.code == 2
    assert caught.value.message.startswith(
        f"iteration 1: the update rejected its input (see {one_update.log(1)}); fix the configuration"
    )
    assert one_update.marker(1) == "failed (exit 2: bad input)"


def test_exit_1_is_a_failed_update_the_run_goes_on_until_max_update_failures_in_a_row(one_update: Update) -> None:
    one_update.exits(1)
    update(one_update.run, 1, False)
    update(one_update.run, 2, False)
    assert one_update.run.failures == 2
    assert one_update.marker(2) == "failed (exit 1)"
    with pytest.raises(say.Die) as caught:
        update(one_update.run, 3, False)
    assert caught.value.code == 1
    assert caught.value.message.startswith("3 updates failed in a row (--max-update-failures 3)")
    one_update.exits(0)  # a promotion resets the count
    update(one_update.run, 4, False)
    assert one_update.run.failures == 0


def test_exit_3_too_little_to_train_on_keeps_the_policy_and_is_no_failure(
    one_update: Update, capsys: pytest.CaptureFixture[str]
) -> None:
    why = "no usable samples for algorithm rft: 0 samples from 9 trajectories; filtered out by rule: not_successful: 9"
    one_update.exits(3, f"[2026-12-01 02:02:05,975 training] nothing to train on:\n{why}\n")
    update(one_update.run, 1, False)
    assert one_update.run.failures == 0
    assert one_update.marker(1) == "skipped: too little to train on"
    # the run's output says why, in the training's words, without the log opened
    said = f"iteration 1: nothing to train on ({why}; log: {one_update.log(1)}); keeping the served policy"
    assert said in capsys.readouterr().err
    # the run's exit reads the last update only: a failure, then a skip, ends the run as the skip does
    one_update.exits(1)
    update(one_update.run, 2, False)
    assert (one_update.run.failures, one_update.run.failed_iteration) == (1, 2)
    one_update.exits(3)
    update(one_update.run, 3, False)
    assert (one_update.run.failures, one_update.run.failed_iteration) == (1, 0)


def test_resume_after_a_training_that_finished_unpromoted_runs_phase_promote_only(one_update: Update) -> None:
    run, log = one_update.run, Path(one_update.run.log)
    (log / "training" / "iter_0003" / "output").mkdir(parents=True)
    (log / "training" / "iter_0003" / "output" / "config.json").write_text("{}\n")
    (log / "metrics.jsonl").write_text('{"kind": "training", "iteration": 3, "steps": 1}\n')
    done = log / "run" / "state" / "iter_0003" / "update.done"
    update(run, 3, False)  # not a resume: train again
    done.unlink()
    update(run, 3, True)  # the finished training, its record written: promote it
    done.unlink()
    (log / "metrics.jsonl").write_text('{"kind": "training", "iteration": 4, "steps": 1}\n')
    update(run, 3, True)  # no record of iteration 3's training (a torn end): train again
    assert one_update.phases.read_text() == "phase=all\nphase=promote\nphase=all\n"


# --- stopping a running update --------------------------------------------------------------------------------


@pytest.fixture
def sessions() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start processes each leading a session of its own (killed afterwards, group and all)."""
    started: list[subprocess.Popen] = []

    def spawn(*cmd: str) -> subprocess.Popen:
        started.append(subprocess.Popen(list(cmd), start_new_session=True))
        return started[-1]

    yield spawn
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def listed(run: Run, iteration: int, *groups: tuple[int, str]) -> None:
    """training/iter_<n>/train.log.pgid: the worker groups python -m training started (pgid start_time)."""
    folder = Path(run.log) / "training" / f"iter_{iteration:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.log.pgid").write_text("".join(f"{pgid} {start}\n" for pgid, start in groups))


def test_stop_update_never_signals_a_recorded_pid_that_now_names_another_process(
    runs: Runs, sessions: Callable[..., subprocess.Popen], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.make()
    run.update_running = 1
    other = sessions("sleep", "300")  # the update ended; its pid was reused
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / GROUPS_NAME).write_bytes(groupfile.encode({"update": groupfile.Record(other.pid, "1")}))
    reused = sessions("sleep", "300")
    listed(run, 1, (reused.pid, "1"))
    stop_update(run)
    assert other.poll() is None and reused.poll() is None
    assert f"update: the recorded pid {other.pid} now names another process; not signalled" in capsys.readouterr().err
    assert run.groups.recorded("update") is None


def test_stop_update_stops_the_recorded_update_and_sigkills_a_listed_worker_group_still_the_recorded_one(
    runs: Runs, sessions: Callable[..., subprocess.Popen]
) -> None:
    run = runs.make()
    run.update_running = 1
    leader = sessions("sleep", "300")
    record = groupfile.Record(leader.pid, start_time(leader.pid) or "")
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / GROUPS_NAME).write_bytes(groupfile.encode({"update": record}))
    worker = sessions("bash", "-c", 'trap "" TERM; sleep 300 & wait')  # a worker group that outlives its launcher
    listed(run, 1, (worker.pid, str(start_time(worker.pid))))
    stop_update(run)
    assert not group_alive(leader.pid)
    assert not group_alive(worker.pid)
    assert run.groups.recorded("update") is None
