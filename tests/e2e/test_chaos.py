"""The short mode of the fault-injection harness (bench/chaos.py, docs/reliability.md): a fixed list of faults
on the real loop, each followed by `--resume` as docs/cli.md tells a user, then the invariants
(bench/chaos_checks.py).

One iteration of `--rl-phase both` with `--debug-mode` against the session's vLLM (so vLLM faults are the
soak's, not this test's):
1. run.sh SIGKILLed mid train rollout (the rollout engine held with SIGSTOP right after its first journaled
   episode, so that it is mid-rollout however fast the machine): its groups run on without it;
2. `--resume`: the new run.sh stops the stale rollout itself and resumes the journal; its rollout engine is
   SIGKILLed after the next episode: the rollout fails, run.sh exits 1 with nothing left;
3. `--resume` finishes the iteration: every planned episode exactly once, v1 promoted from iteration 1 with
   no parent, one iteration record, nothing of the run left running.
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


def journaled(log: Path) -> int:
    path = log / "trajectories" / "train" / "iter_0001" / "rank_0.jsonl"
    return len(read_lines(path)) if path.exists() else 0


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
        chaos.proc.send_signal(signal.SIGKILL)
        rc, hung = chaos.finish("run.sh to die of SIGKILL")
        assert (rc, hung) == (-signal.SIGKILL, False)
        assert leftover_processes(log), "the SIGKILLed run.sh left nothing running: not the fault meant"

        chaos.start(resume=True)
        resumed = hold_after_next_episode(chaos, start_s)
        assert resumed > first
        assert chaos.signal_groups("train_rollout", 1, signal.SIGKILL)
        rc, hung = chaos.finish("run.sh to stop after its rollout engine was SIGKILLed")
        assert (rc, hung) == (1, False), chaos.output()[-3000:]
        assert "the train rollout of iteration 1 failed" in chaos.output()
        assert not leftover_processes(log)

        chaos.start(resume=True)
        rc, hung = chaos.finish("run.sh --resume to finish iteration 1")
        assert (rc, hung) == (0, False), chaos.output()[-3000:]
    finally:
        chaos.stop()
    report = check_log(log)
    assert report.problems() == [], report.problems()
    train = [r for r in report.rollouts if "/train/" in r.journal]
    assert [(r.planned, r.unique, r.asides) for r in train] == [(96, 96, 0)]
    # one success among the 96 episodes trains one step (batch 1), as the other one-step loops here rely on
    update = (log / "run" / "state" / "iter_0001" / "update.done").read_text()
    assert update.strip() == "promoted v1", update
