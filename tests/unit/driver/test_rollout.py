"""coordinator/driver/rollout.py (and phase.run_group): a rollout's deadlines, a policy server that died or
hangs under it, serving the current policy at the start, and --keep-best's revert.

The rollout engine is a fake app interpreter (a bash script recording `rollout resume=0|1` and doing what
the test says: exit with a code, or hang); vLLM is tests/shell/fake_vllm.py, started, stopped (or frozen
with SIGSTOP) as the driver's own recorded group. --keep-best runs the real `python -m training
phase=revert` in the train environment.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator import runstate
from coordinator.driver import rollout, say
from coordinator.driver import run as driver_run
from coordinator.driver.context import Run
from coordinator.driver.phase import run_group
from coordinator.driver.procs import Groups, group_alive
from coordinator.driver.say import Die
from coordinator.driver.supervise import EXPIRED
from coordinator.driver.vllm import PolicyServer
from rollout_engine.metrics_log import load_metrics
from tests.conftest import env_python
from tests.unit.driver.fakes import Runs, model_folder, running, wait_for

# --- deadlines ------------------------------------------------------------------------------------------------


def journaling(run: Run, script: str, stall_s: float) -> int:
    """run_group of a train rollout running `script` (bash; $J is its journal) with a stall deadline."""
    journal = run.layout.journal("train", 1, 0)
    journal.parent.mkdir(parents=True, exist_ok=True)
    return run_group(
        run,
        "rollout-train",
        run.run_dir / "logs" / "r.log",
        ["bash", "-c", f"J={journal}; {script}"],
        stall_s=stall_s,
        progress=lambda: rollout.progress(run, "train", 1),
    )


def test_a_rollout_whose_journal_stops_growing_is_stopped_as_a_whole_group(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.make()
    # a 'rollout' that journals one episode, then hangs with a child in its group
    code = journaling(run, "echo '{}' >>$J; sleep 399.31 & sleep 399.31; wait", stall_s=2)
    assert code == EXPIRED
    assert (
        "[baton] warning: rollout-train: no progress for 2s (no episode finished; BATON_ROLLOUT_STALL_S); stopping it"
        in capsys.readouterr().err
    )
    assert run.groups.recorded("rollout-train") is None
    assert not running("sleep 399.31")


def test_a_rollout_that_keeps_journaling_is_not_stopped_by_the_stall_deadline(runs: Runs) -> None:
    run = runs.make()
    code = journaling(run, "for i in 1 2 3 4 5 6 7 8; do echo '{}' >>$J; sleep 0.5; done", stall_s=2)
    assert code == 0
    assert len(run.layout.journal("train", 1, 0).read_text().splitlines()) == 8


def test_policy_answers_is_false_within_its_limit_for_a_server_that_accepts_connections_and_never_answers(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollout, "ANSWER_S", 1.0)
    run = runs.make()
    with socket.socket() as silent:  # the kernel completes the handshake; no reply ever comes
        silent.bind(("127.0.0.1", run.port))
        silent.listen(8)
        got: list[bool] = []
        asking = threading.Thread(target=lambda: got.append(rollout.policy_answers(run)), daemon=True)
        began = time.monotonic()
        asking.start()
        asking.join(timeout=15)  # without its limit it would wait for as long as the server lives
        assert not asking.is_alive(), "policy_answers still waiting for a server that never answers"
    assert got == [False] and time.monotonic() - began < 10


# --- a policy server that dies or hangs under the rollout -----------------------------------------------------


class Rollouts:
    """A serving run whose rollout engine does, call after call, what `does` lists (an exit code, or `hang`),
    recording `rollout resume=0|1` in `events`; the server's stops and starts are recorded there too."""

    def __init__(self, runs: Runs, monkeypatch: pytest.MonkeyPatch, debug: bool = False) -> None:
        monkeypatch.setenv("BATON_POLICY_RESTARTS", "3")
        monkeypatch.setenv("BATON_ROLLOUT_STALL_S", "1")
        monkeypatch.setattr(rollout, "ANSWER_S", 1.0)
        self.run = runs.make(serve=not debug, debug=debug)
        self.events, self.actions = runs.tmp / "events", runs.tmp / "actions"
        self.events.write_text("")
        body = (
            'r=0; [[ " $* " != *" resume=true "* ]] || r=1\n'
            f'echo "rollout resume=$r" >>{self.events}\n'
            f"a=$(head -n 1 {self.actions}); sed -i 1d {self.actions}\n"
            '[[ $a != hang ]] || exec sleep 300.17\nexit "$a"'
        )
        runs.fake_python(self.run, "app", body)
        if self.run.server is not None:
            rollout.ensure_server(self.run)
            self.spy(self.run.server)

    def spy(self, server: PolicyServer) -> None:
        stop, start = server.stop, server.start

        def stopped(*args: object, **kw: object) -> None:
            self.note("vllm_stop")
            stop(*args, **kw)  # type: ignore[arg-type]

        def started(*args: object, **kw: object) -> None:
            self.note("vllm_start")
            start(*args, **kw)  # type: ignore[arg-type]

        server.stop, server.start = stopped, started  # type: ignore[method-assign]

    def note(self, event: str) -> None:
        with self.events.open("a") as out:
            out.write(event + "\n")

    def does(self, *actions: object) -> None:
        self.actions.write_text("".join(f"{a}\n" for a in actions))

    def __call__(self, split: str = "train", iteration: int = 1) -> list[int]:
        return rollout.rollout_run(self.run, split, iteration, False)

    def seen(self) -> list[str]:
        return self.events.read_text().splitlines()

    def vllm_pgid(self) -> int:
        record = self.run.groups.recorded("vllm")
        assert record is not None
        return record[0]

    def serving(self) -> bool:
        return self.run.server is not None and self.run.server.serves()


@pytest.fixture
def rollouts(runs: Runs, monkeypatch: pytest.MonkeyPatch) -> Rollouts:
    return Rollouts(runs, monkeypatch)


FAILED = "the train rollout of iteration 1 failed; fix the cause, then rerun with --resume"


def test_the_policy_server_died_under_the_rollout_vllm_restarts_and_the_rollout_resumes(
    rollouts: Rollouts, capsys: pytest.CaptureFixture[str]
) -> None:
    rollouts.does(75, 75, 0)
    assert rollouts() == []
    assert rollouts.seen() == [
        "rollout resume=0",
        "vllm_stop",
        "vllm_start",
        "rollout resume=1",
        "vllm_stop",
        "vllm_start",
        "rollout resume=1",
    ]
    assert (
        "the policy server stopped answering during the train rollout; restarting vLLM and resuming (restart 2 of 3)"
        in capsys.readouterr().err
    )
    assert rollouts.serving()


def test_a_server_that_keeps_dying_after_the_restarts_the_rollout_fails(rollouts: Rollouts) -> None:
    rollouts.does(75, 75, 75, 75, 0)
    with pytest.raises(say.Die) as caught:
        rollouts()
    assert (caught.value.code, caught.value.message) == (1, FAILED)
    assert [e for e in rollouts.seen() if e.startswith("rollout")] == ["rollout resume=0"] + ["rollout resume=1"] * 3
    assert rollouts.seen().count("vllm_start") == 3


def test_debug_mode_the_external_server_is_not_ours_to_restart(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rollouts = Rollouts(runs, monkeypatch, debug=True)
    rollouts.does(75, 0)
    with pytest.raises(say.Die):
        rollouts()
    assert rollouts.seen() == ["rollout resume=0"]
    assert "(debug mode: it is not ours to restart)" in capsys.readouterr().err


def test_another_failure_is_the_rollout_s_own_no_restart(rollouts: Rollouts) -> None:
    rollouts.does(1, 0)
    with pytest.raises(say.Die) as caught:
        rollouts("test", 2)
    assert caught.value.message == "the test rollout of iteration 2 failed; fix the cause, then rerun with --resume"
    assert rollouts.seen() == ["rollout resume=0"]


def test_a_stuck_rollout_while_the_policy_server_answers_is_resumed_vllm_left_alone(
    rollouts: Rollouts, capsys: pytest.CaptureFixture[str]
) -> None:
    served = rollouts.vllm_pgid()
    rollouts.does("hang", 0)
    assert rollouts() == []
    assert rollouts.seen() == ["rollout resume=0", "rollout resume=1"]
    assert (
        "the train rollout was stuck while the policy server answers; resuming it (restart 1 of 3)"
        in capsys.readouterr().err
    )
    assert rollouts.vllm_pgid() == served and not running("sleep 300.17")


def test_a_stuck_rollout_while_the_policy_server_hangs_restarts_vllm_and_resumes(rollouts: Rollouts) -> None:
    hung = rollouts.vllm_pgid()
    rollouts.run.groups.signal("vllm", signal.SIGSTOP)  # a hung vLLM: connections accepted, never answered
    rollouts.does("hang", 0)
    assert rollouts() == []
    assert rollouts.seen() == ["rollout resume=0", "vllm_stop", "vllm_start", "rollout resume=1"]
    assert not group_alive(hung) and rollouts.vllm_pgid() != hung and rollouts.serving()


def test_exit_2_with_our_server_not_answering_is_a_dead_server_with_it_answering_bad_input(
    rollouts: Rollouts, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = rollouts.vllm_pgid()
    rollouts.run.groups.signal("vllm", signal.SIGKILL)  # vLLM died meanwhile
    wait_for(lambda: not group_alive(dead), "the killed vLLM's end")
    rollouts.does(2, 0)
    assert rollouts() == []
    assert rollouts.seen() == ["rollout resume=0", "vllm_stop", "vllm_start", "rollout resume=1"]
    assert (
        "the train rollout found the policy server unreachable at its start: it died meanwhile"
        in capsys.readouterr().err
    )
    rollouts.events.write_text("")
    rollouts.does(2, 0)  # the server answers: the engine's exit 2 is bad input, the rollout's own
    with pytest.raises(say.Die):
        rollouts()
    assert rollouts.seen() == ["rollout resume=0"]


# --- serving the current policy at the start ------------------------------------------------------------------


def test_a_run_resumed_after_an_upgrade_takes_over_the_groups_an_older_baton_recorded_one_file_each(
    runs: Runs, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    # Baton before groups.json: `pids/<name>.pgid` ("pgid start") a group, `vllm.weights` the served model
    run = runs.make(serve=True)
    run.roles, run.group_names = ["rollout", "update"], ["update", "rollout-train", "vllm"]  # as build() names them
    server = run.server
    assert server is not None
    model = run.policy_path()
    old = Groups(run.run_dir / "old")  # started elsewhere, so that only the legacy files name them
    vllm = old.start(
        "vllm", [server.serve_py, "--port", str(run.port), "--served-model-name", "policy", "--model", model], None
    )
    train = old.start("rollout-train", ["sleep", "300"], None)
    request.addfinalizer(lambda: [old.stop(name, 2) for name in ("vllm", "rollout-train")])  # whatever the outcome
    pids = run.run_dir / "pids"
    pids.mkdir(parents=True)
    (pids / "vllm.pgid").write_text(f"{vllm.pgid} {vllm.start}\n")
    (pids / "rollout-train.pgid").write_text(f"{train.pgid} {train.start}\n")
    (run.run_dir / "vllm.weights").write_text(f"{model}\n")
    wait_for(lambda: server.answers(), "the older run's vLLM")

    driver_run.claim(run)

    assert not pids.exists() and not (run.run_dir / "vllm.weights").exists()
    assert not group_alive(train.pgid)  # a stale phase, stopped as a record of groups.json would be
    assert run.groups.recorded("vllm") == (vllm.pgid, vllm.start) and run.groups.holds("vllm") == model
    rollout.ensure_server(run)  # reused, holding the current policy's weights: no reload, no restart
    err = capsys.readouterr().err
    assert "rollout-train (group" in err and "was left running by an earlier run; stopping it" in err
    assert "already serves policy; reusing it" in err and f"holds the current policy's weights ({model}) already" in err
    assert "starting vLLM" not in err and group_alive(vllm.pgid)


def test_ensure_server_restarts_a_recorded_vllm_unless_it_serves_the_name_and_reloads_a_reused_one(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs.make(serve=True)
    server = run.server
    assert server is not None
    model = run.policy_path()
    served_new: list[str] = []
    serve_new = server.serve_new
    server.serve_new = lambda m: served_new.append(m) or serve_new(m)  # type: ignore[method-assign]
    # a vLLM this run directory recorded, serving another name on the port: stopped, a new one started
    other = run.groups.start(
        "vllm", [server.serve_py, "--port", str(run.port), "--served-model-name", "other", "--model", model], server.log
    )
    wait_for(lambda: server.answers(), "the recorded vLLM serving another name")
    rollout.ensure_server(run)
    err = capsys.readouterr().err
    assert f"(group {other.pgid}) does not serve policy on port {run.port}; restarting it" in err
    assert f"starting vLLM (policy from {model}, port {run.port}, attempt 1/3" in err
    assert not group_alive(other.pgid) and server.serves(model) and run.served_version == ""
    assert server.recorded_weights() == model and served_new == []
    started = run.groups.recorded("vllm")
    # reused, holding the current policy's weights (recorded): no reload, no restart
    rollout.ensure_server(run)
    err = capsys.readouterr().err
    assert "already serves policy; reusing it" in err and f"holds the current policy's weights ({model}) already" in err
    assert "starting vLLM" not in err and served_new == [] and run.groups.recorded("vllm") == started
    # reused, with no record of its weights (a run that died after a promotion), or older ones: loaded again
    for weights in ("", "/elsewhere/v0001"):
        server.record_weights(weights)
        rollout.ensure_server(run)
        assert "already serves policy; reusing it" in capsys.readouterr().err
        assert served_new[-1] == model and run.served_version == ""
    assert len(served_new) == 2


# --- --keep-best ----------------------------------------------------------------------------------------------


class KeepBest:
    """The master of a --keep-best run: promoted versions and held-out records on its log path; the revert is
    the real `python -m training phase=revert` in the train environment."""

    def __init__(self, runs: Runs) -> None:
        self.run = runs.make(keep_best=True, keep_best_margin="0")
        self.run.pythons = replace(self.run.pythons, train=env_python("train"))
        self.log = Path(self.run.log)
        model_folder(Path(self.run.base_model), "w0", config={})

    def policy(self, *versions: int) -> None:
        """Promoted versions v<NNNN> (each the child of the one before), current the last."""
        parent = None
        for v in versions:
            folder = model_folder(self.log / "policy" / f"v{v:04d}", f"w{v}", config={})
            record = {"version": v, "iteration": v, "parent": parent}
            (folder / "baton_policy.json").write_text(json.dumps(record) + "\n")
            parent = v
        current = self.log / "policy" / "current"
        current.unlink(missing_ok=True)
        current.symlink_to(f"v{versions[-1]:04d}")

    def held_out(self, iteration: int, version: int | None, rate: float) -> None:
        row = {"kind": "rollout", "split": "test", "iteration": iteration, "policy_version": version}
        with (self.log / "metrics.jsonl").open("a") as out:
            out.write(json.dumps({**row, "success_rate": rate, "ok_episodes": 40}) + "\n")

    def current(self) -> str:
        return (self.log / "policy" / "current").readlink().name

    def reverts(self) -> list[dict]:
        return [row for row in load_metrics(self.log) if row.get("kind") == "revert"]


@pytest.fixture
def best(runs: Runs) -> KeepBest:
    return KeepBest(runs)


def test_a_policy_as_good_as_the_best_is_kept_nothing_promoted(
    best: KeepBest, capsys: pytest.CaptureFixture[str]
) -> None:
    best.policy(1, 2, 3, 4)
    best.held_out(3, 2, 0.2)
    best.held_out(5, 4, 0.2)
    rollout.keep_best(best.run, 5)
    assert capsys.readouterr().err == ""
    assert best.current() == "v0004" and not (best.log / "policy" / "v0005").exists() and best.reverts() == []


def test_a_policy_within_the_margin_is_kept_and_says_so(best: KeepBest, capsys: pytest.CaptureFixture[str]) -> None:
    best.policy(1, 2, 3, 4)
    best.held_out(3, 2, 0.2)
    best.held_out(5, 4, 0.125)
    best.run.args.keep_best_margin = "10"
    rollout.keep_best(best.run, 5)
    assert capsys.readouterr().err == (
        "[baton] iteration 5: held-out 12.5 % for v4, best 20.0 % for v2: within 10 points, keeping v4 (--keep-best)\n"
    )
    assert best.current() == "v0004"


def test_a_worse_policy_the_best_s_weights_are_promoted_as_the_next_version_logged_once_and_recorded(
    best: KeepBest, capsys: pytest.CaptureFixture[str]
) -> None:
    best.policy(1, 2, 3, 4)
    best.held_out(1, None, 0.1)
    best.held_out(3, 2, 0.2)
    best.held_out(5, 4, 0.125)
    rollout.keep_best(best.run, 5)
    err = capsys.readouterr().err
    said = "[baton] held-out 12.5 % for v4 < 20.0 % for v2 (best): serving v2 again as v5 (--keep-best)\n"
    assert said in err and err.count("serving v2 again") == 1
    assert best.current() == "v0005"
    assert (best.log / "policy" / "v0005" / "model.safetensors").read_text() == "w2\n"
    record = json.loads((best.log / "policy" / "v0005" / "baton_policy.json").read_text())
    assert (record["parent"], record["reverted_to"], record["iteration"], record["why"]["replaced"]) == (4, 2, 5, 4)
    assert [(r["iteration"], r["policy_version"], r["reverted_to"]) for r in best.reverts()] == [(5, 5, 2)]
    assert (best.log / "policy" / "best").readlink().name == "v0002"  # kept by pruning while it is the best


def test_a_resumed_iteration_is_not_reverted_twice_even_when_the_run_died_before_the_revert_s_record(
    best: KeepBest, capsys: pytest.CaptureFixture[str]
) -> None:
    best.policy(1, 2, 3, 4)
    best.held_out(3, 2, 0.2)
    best.held_out(5, 4, 0.125)
    rollout.keep_best(best.run, 5)
    capsys.readouterr()
    rollout.keep_best(best.run, 5)  # --resume after the revert: nothing more
    assert capsys.readouterr().err == ""
    metrics = best.log / "metrics" / "update.jsonl"  # the revert's record is the update's (merged at the step's end)
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if '"revert"' not in line))
    rollout.keep_best(best.run, 5)  # died between the promotion and its record: the same version again
    assert "serving v2 again as v5 (--keep-best)" in capsys.readouterr().err
    assert not (best.log / "policy" / "v0006").exists() and best.current() == "v0005"
    assert len(best.reverts()) == 1


def test_the_base_model_as_the_best_its_folder_becomes_the_next_version(
    best: KeepBest, capsys: pytest.CaptureFixture[str]
) -> None:
    best.policy(1)
    best.held_out(1, None, 0.3)
    best.held_out(2, 1, 0.1)
    rollout.keep_best(best.run, 2)
    assert (
        "[baton] held-out 10.0 % for v1 < 30.0 % for the base model (best): serving the base model again as v2 "
        "(--keep-best)\n"
    ) in capsys.readouterr().err
    assert (best.log / "policy" / "current" / "model.safetensors").read_text() == "w0\n"
    assert not (best.log / "policy" / "best").exists()


def test_no_held_out_rollout_this_iteration_nothing_to_decide(
    best: KeepBest, capsys: pytest.CaptureFixture[str]
) -> None:
    best.policy(1)
    best.held_out(1, None, 0.3)
    rollout.keep_best(best.run, 2)
    assert capsys.readouterr().err == ""
    assert best.current() == "v0001"


@pytest.mark.parametrize("complete", [False, True])
def test_a_master_whose_train_merge_is_not_complete_leaves_the_phase_unmarked_for_a_resume_to_merge_again(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, complete: bool
) -> None:
    """The update refuses an incomplete merge, and a resume skips a phase marked done: marked, it would refuse
    at every resume (a soak on sshfs). Unmarked, a resume rolls out again (the sealed journals are kept) and
    merges again."""
    import coordinator.aggregate

    run = runs.make(num_nodes=2, rank_weights="1,1")
    monkeypatch.setattr(rollout, "rollout_run", lambda *args: [])
    monkeypatch.setattr(coordinator.aggregate, "aggregate", lambda *args: {"complete": complete})
    if complete:
        rollout.rollout(run, "train", 1, False)
    else:
        with pytest.raises(Die, match=r"^the merge of the ranks' train rollouts of iteration 1 is not complete"):
            rollout.rollout(run, "train", 1, False)
    assert runstate.is_done(run.log, 1, "train_rollout") is complete


def test_the_rollout_is_told_this_node_s_resolved_context_after_the_overrides(runs: Runs) -> None:
    """The context run.sh resolved for this node (auto decided, the node file's value in) ends the rollout's command
    line, so that its config says what its server serves; without a server of ours (--debug-mode) nothing."""
    from coordinator.driver.vllm_settings import Machine, resolve
    from rollout_engine.config import VllmConfig
    from tests.unit.driver.fakes import SHAPE

    run = runs.make(phase="rollout", split="train-only")
    run.composed.rollout = ["vllm_config.max_model_len=0"]
    assert rollout.rollout_cmd(run, "train", 1, False)[-1] == "vllm_config.max_model_len=0"
    run.composed.vllm = resolve(VllmConfig(), Machine("cpu", 0, 1), SHAPE, run.log)
    assert rollout.rollout_cmd(run, "train", 1, False)[-2:] == [
        "vllm_config.max_model_len=0",
        "vllm_config.max_model_len=2048",
    ]
