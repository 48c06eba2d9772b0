"""Running one phase as a tracked process group, and recording it (the master's markers and times).

code = run_group(run, "update", log, cmd)          # started, watched, its live view, its end told
with timed(run, n, "update"): ...                  # seconds recorded for iteration n (the master)
mark(run, n, "update", "promoted v3")             # the master's marker, while its run is the log path's
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator import runstate
from coordinator.driver.context import Run
from coordinator.driver.say import log, warn
from coordinator.driver.supervise import EXPIRED
from rollout_engine.defaults import PROGRESS_S


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_group(
    run: Run,
    name: str,
    logfile: Path,
    cmd: list[str],
    *,
    total_s: float = 0,
    stall_s: float = 0,
    progress: Callable[[], object] | None = None,
) -> int:
    """Run `cmd` as the tracked group `name` and wait for it (the watches ticking); its exit code.
    Past a deadline (total_s, or stall_s without a change of progress()) it is stopped: EXPIRED."""
    start = time.monotonic()
    log(f"{name}: started (log: {logfile})")
    group = run.groups.start(name, cmd, logfile, env=run.env())
    if name in ("rollout-train", "rollout-test", "update"):
        watch_start(run, name)
    try:
        code = run.supervisor.wait(group, total_s=total_s, stall_s=stall_s, progress=progress)
    finally:
        # (a wait ended by a signal or a dead peer leaves the group recorded: the clean-up stops it)
        watch_stop(run)  # before the driver prints again: a terminal's live block is cleared first
    if code == EXPIRED:
        warn(f"{name}: {run.supervisor.expired}; stopping it")
        run.groups.stop(name, 10)
    run.groups.forget(name)
    took = int(time.monotonic() - start)
    if code == EXPIRED:
        warn(f"{name}: stopped after {took}s (log: {logfile})")
    elif code != 0:
        warn(f"{name} failed (exit {code}) after {took}s; last lines of {logfile}:")
        print(tail(logfile), file=sys.stderr, flush=True)
    else:
        log(f"{name}: done in {took}s")
    return code


def watch_start(run: Run, phase: str) -> None:
    """Show a phase's progress (every rank's, read from the log path) on stderr while it runs:
    `python -m coordinator watch` as the tracked group run.watch_name. BATON_PROGRESS_S=0: off."""
    every = PROGRESS_S.value()
    if every == 0:
        return
    cmd = [run.pythons.app, "-m", "coordinator", "watch", "--log-path", run.log, "--phase", phase]
    cmd += ["--iteration", str(run.iteration), "--every", str(every)]
    if run.node.multi:  # a worker's view reads its own rank and the master's totals, not every rank's files
        cmd += ["--rank", str(run.args.rank)]
    run.groups.start(run.watch_name, cmd, None, env=run.env())


def watch_stop(run: Run) -> None:
    run.groups.stop(run.watch_name, 5)


@contextmanager
def timed(run: Run, iteration: int, phase: str) -> Iterator[None]:
    """Record the seconds the block took as `phase` of `iteration` (the master records; a block that ends
    the run records nothing)."""
    start = time.monotonic()
    run.phase = phase
    yield
    if run.node.is_master:
        run.node.fence(f"recording the time of {phase} of iteration {iteration}")
        runstate.add_time(run.log, iteration, phase, time.monotonic() - start)


def mark(run: Run, iteration: int, phase: str, content: str = "") -> None:
    """The master's (a single node's) marker of `phase`, while its run is the log path's."""
    if not run.node.is_master:
        return
    run.node.fence(f"marking {phase} of iteration {iteration}")
    runstate.mark(run.log, iteration, phase, content)


def dashboard_cmd(run: Run) -> list[str]:
    cmd = [run.pythons.app, "-m", "coordinator", "dashboard", "--log-path", run.log]
    return [*cmd, "--port", str(run.args.dashboard_port), "--host", "127.0.0.1"]
