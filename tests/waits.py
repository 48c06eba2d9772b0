"""Bounded waits for the e2e tests.

Every bound is derived from the work waited for and sized for the slowest
machine the suite runs on (a 2-core AMD EPYC with AVX2 only, where vLLM
generated 10-14 tokens/s before it served float32; `SLOWEST_TOKENS_PER_S` is
below that, so a bound holds there even if serving falls back to bf16). A
wait that runs out fails the test saying what it waited for, how long, and the
end of the process's output; it never raises a bare `TimeoutExpired`.

    out = run_waiting(cmd, waiting_for="a rollout of 192 episodes", timeout=generation_s(192, 24))
    out = communicate_waiting(proc, waiting_for="run.sh to finish 2 iterations", timeout=...)
    wait_until(lambda: path.exists(), waiting_for="rank 1's journal", timeout=START_S)
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

#: generation speed the bounds assume (tokens/s through one vLLM on 2 cores, the slowest we have seen)
SLOWEST_TOKENS_PER_S = 8.0
#: a process's own start: Python imports, environment and scorer start-up, the first request
START_S = 120.0
#: vLLM's start on 2 cores (about 45 s in eager mode; PolicyServer.start allows 600 s per attempt)
VLLM_START_S = 300.0
#: one LLaMA-Factory update with its start-up on 2 cores, for the few optimizer steps the tests run
UPDATE_S = 900.0
#: a system daemon's start (munged, slurmctld, slurmd: about a second each on 2 cores)
DAEMON_START_S = 60.0


def generation_s(episodes: int, max_tokens: int, turns: int = 1) -> float:
    """Seconds to generate `episodes` x `turns` replies of at most `max_tokens` tokens, plus start-up."""
    return START_S + episodes * turns * max_tokens / SLOWEST_TOKENS_PER_S


def _tail(text: str | bytes | None, n: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def run_waiting(cmd: list[str], *, waiting_for: str, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output, text) with a bound that fails the test naming what it waited for."""
    kwargs = {"capture_output": True, "text": True, "check": False, **kwargs}
    try:
        return subprocess.run(cmd, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        output = _tail(exc.stdout) + _tail(exc.stderr)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {waiting_for}; last output:\n{output}")


def communicate_waiting(proc: subprocess.Popen, *, waiting_for: str, timeout: float) -> str:
    """proc.communicate() within `timeout`; on expiry stop the process (SIGTERM, then SIGKILL) and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # run.sh and the engine clean up their own groups on SIGTERM
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        output = _tail(out) + _tail(err)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {waiting_for}; last output:\n{output}")
    return (out or "") + (err or "")


def wait_until(
    condition: Callable[[], bool],
    *,
    waiting_for: str,
    timeout: float,
    every: float = 0.5,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll `condition` every `every` s until it is true; fail naming what was awaited after `timeout` s.
    `check`, run before each poll, may fail the test sooner (say, when the process waited on has ended)."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if condition():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {waiting_for}")
        time.sleep(every)
