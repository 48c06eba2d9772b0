"""The short mode of the fault-injection harness (bench/chaos.py, docs/reliability.md): a fixed list of faults
on the real loop, each followed by `--resume` as docs/cli.md tells a user, then the invariants
(bench/chaos_checks.py).

One iteration of `--rl-phase both` with `--debug-mode` against the session's vLLM (so vLLM faults are the
soak's, not this test's):
1. run.sh SIGKILLed mid train rollout (the rollout engine held with SIGSTOP right after its first journaled
   episode, so that it is mid-rollout however fast the machine): its groups run on without it;
2. `--resume` with a short stall deadline (`BATON_ROLLOUT_STALL_S`): the new run.sh skips the update-check
   that passed in run 1, stops the stale rollout itself and resumes the journal; its rollout engine is held
   with SIGSTOP after the next episode (a hang): run.sh's stall deadline stops it, sees the policy server
   answer, resumes the rollout on its own and finishes the iteration (exit 0): every planned episode
   exactly once, v1 promoted from iteration 1 with no parent, one iteration record, nothing of the run
   left running.
(A rollout engine SIGKILLed, which fails the rollout with exit 1, is the soak's and
tests/shell/run_update_check.bats'.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from bench.chaos import Chaos
from bench.chaos_checks import check_log, leftover_processes, read_lines
from tests.e2e.conftest import VllmServer
from tests.waits import UPDATE_S, generation_s

pytestmark = pytest.mark.e2e

#: the stall deadline of the second run: above a rollout engine's start with its first episode against a
#: warm vLLM (about 10 s on 2 cores), far below the 900 s default
STALL_S = 40


def journaled(log: Path) -> int:
    path = log / "trajectories" / "train" / "iter_0001" / "rank_0.jsonl"
    return len(read_lines(path)) if path.exists() else 0


def rollout_groups(chaos: Chaos) -> set[int]:
    return {pgid for pgid, _ in chaos.groups("train_rollout", 1)}


def wait_new_engine(chaos: Chaos, old: set[int], timeout: float) -> None:
    """Wait until the resumed run records a rollout-train group of its own. Before that the record still names
    the held engine of the killed run, which the resumed run continues and stops: an episode it had in flight
    may be journaled then, and holding "after the next episode" would hold the dying engine, not the new one."""
    deadline = time.monotonic() + timeout
    while not rollout_groups(chaos) - old:
        assert chaos.proc.poll() is None, f"run.sh exited ({chaos.proc.returncode}):\n{chaos.output()[-3000:]}"
        assert time.monotonic() < deadline, f"the resumed run recorded no rollout-train group within {timeout:.0f} s"
        time.sleep(0.02)


def hold_after_next_episode(chaos: Chaos, timeout: float) -> int:
    """Wait for the train rollout's next journaled episode, then SIGSTOP its engine; the episodes journaled."""
    before, deadline = journaled(chaos.log), time.monotonic() + timeout
    while journaled(chaos.log) <= before:
        assert chaos.proc.poll() is None, f"run.sh exited ({chaos.proc.returncode}):\n{chaos.output()[-3000:]}"
        assert time.monotonic() < deadline, f"no train episode journaled after {before} within {timeout:.0f} s"
        time.sleep(0.02)
    assert chaos.signal_groups("train_rollout", 1, signal.SIGSTOP), "no rollout-train group recorded"
    return journaled(chaos.log)


def test_run_sh_and_rollout_killed_then_resume_keeps_every_invariant(
    vllm_server: VllmServer, data_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "exp"
    debug = [
        "--debug-mode",
        f"policy_config.base_url={vllm_server.base_url}",
        f"policy_config.model={vllm_server.model}",
    ]
    chaos = Chaos(data_dir, log, vllm_server.port, debug, run_budget_s=generation_s(128, 24) + UPDATE_S, hang_s=0)
    start_s = generation_s(1, 24)  # run.sh's start (the update-check) and the first episode
    try:
        chaos.start(resume=False)
        first = hold_after_next_episode(chaos, start_s)
        held = rollout_groups(chaos)
        chaos.proc.send_signal(signal.SIGKILL)
        rc, hung = chaos.finish("run.sh to die of SIGKILL")
        assert (rc, hung) == (-signal.SIGKILL, False)
        assert leftover_processes(log), "the SIGKILLed run.sh left nothing running: not the fault meant"

        chaos.env = {"BATON_ROLLOUT_STALL_S": str(STALL_S)}
        chaos.start(resume=True)
        wait_new_engine(chaos, held, start_s)
        resumed = hold_after_next_episode(chaos, start_s)
        assert resumed > first
        rc, hung = chaos.finish("run.sh --resume to catch the hung engine and finish iteration 1")
        assert (rc, hung) == (0, False), chaos.output()[-3000:]
        out = chaos.output()
        assert "update-check: passed before with this command, environment and code; not run again" in out
        assert f"rollout-train: no progress for {STALL_S}s (no episode finished; BATON_ROLLOUT_STALL_S)" in out
        assert "the train rollout was stuck while the policy server answers; resuming it (restart 1 of 3)" in out
    finally:
        chaos.stop()
    report = check_log(log)
    assert report.problems() == [], report.problems()
    train = [r for r in report.rollouts if "/train/" in r.journal]
    assert [(r.planned, r.unique, r.asides) for r in train] == [(96, 96, 0)]
    # a success among the 96 episodes (bench/chaos.py SETTINGS) trains one step (batch 1)
    update = (log / "run" / "state" / "iter_0001" / "update.done").read_text()
    assert update.strip() == "promoted v1", update
