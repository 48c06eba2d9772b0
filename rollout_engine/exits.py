"""The exit codes of every Baton command, named once (the table per command: docs/cli.md#exit-codes).

    raise SystemExit(Exit.BAD_INPUT)
    return Exit.POLICY_DOWN

Callers (the driver: coordinator/driver/rollout.py, update.py, nodes.py) act on them, so a
number never changes meaning within one command. Across commands some numbers
mean different things; the names below say which command means what, and
the aliases make each collision visible here (an alias is the same number:
`Exit.NOTHING_TO_TRAIN is Exit.INTERNAL`):

    3   python -m rollout_engine: INTERNAL; python -m training: NOTHING_TO_TRAIN;
        python -m coordinator (protocol): RANK_FAILED;
        python -m rollout_engine.demonstrations: NONE_SOLVED
    4   python -m coordinator: RUN_STOPPED (a waiting subcommand), RUN_NOT_RUNNING (stop --if-running)
"""

from __future__ import annotations

import signal
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    #: a phase or the training failed (run it again; run.sh: --resume), a helper found nothing to do
    FAILED = 1
    #: bad input: config, task file, flags; nothing was written or launched
    BAD_INPUT = 2
    #: python -m rollout_engine: an error in the engine itself (a bug, a full disk)
    INTERNAL = 3
    #: python -m training: too little data for one optimizer step (nothing written); run.sh records `skipped`
    NOTHING_TO_TRAIN = 3
    #: python -m coordinator: a rank this node waits for failed, was evicted or stopped beating
    RANK_FAILED = 3
    #: python -m rollout_engine.demonstrations: the expert solved no task (nothing written)
    NONE_SOLVED = 3
    #: python -m coordinator: the run was asked to stop (stop.json) or a newer master start superseded it
    RUN_STOPPED = 4
    #: python -m coordinator stop --if-running: the run is not running (finished, stopped, its master gone)
    RUN_NOT_RUNNING = 4
    #: python -m coordinator: the master declared this node's rank dead
    EVICTED = 5
    #: python -m coordinator: the master ran the run's last step and exited; nothing left to do
    RUN_FINISHED = 6
    #: python -m rollout_engine: the policy server stopped answering (EX_TEMPFAIL; run.sh restarts vLLM, resumes)
    POLICY_DOWN = 75
    #: stopped by SIGINT / SIGTERM (128 + the signal's number)
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM


def signal_exit(signum: int) -> int:
    """The exit code of a process stopped by signal `signum` (the shell's 128 + n)."""
    return 128 + signum
