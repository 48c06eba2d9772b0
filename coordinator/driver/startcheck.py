"""The shared-filesystem check at every multi-node start (coordinator/fscheck.py; `run.sh --check-shared-fs` is
the long one), beside the start rather than in its way:

    check = StartCheck.begin(cluster, record)   # a thread: the master's side (cluster.rank 0), or a worker's
    supervisor.add(check.watch)        # logs the master's findings once there; bad input (exit 2) on a verdict
    check.stop()                       # on the way out

A worker joins only after it saw the master beat (a beat or two after the master started), so the master first
waits for every rank to register (at most REGISTER_WAIT_S), then pings at most CHECKED_RANKS of them, spread over
the cluster (the others take no part: the check's files and 10 ms polls stay the same at any N); the check itself
takes at most BATON_FS_CHECK_S: 30 % of it waiting for the answers, a fifth for each watch. A rank that registers
later takes no part (`fscheck.lead` writes `closed`). Meanwhile the node goes on (vLLM starts): the findings come a few
seconds into the run, at the next supervisor tick.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from coordinator.cluster import Cluster, RunRecord
from coordinator.driver import say
from coordinator.fscheck import checked_ranks, follow, lead, save_findings, summary, verdict
from rollout_engine.defaults import FS_CHECK_S

#: how long the master waits for every rank to register before it checks with those that did (s)
REGISTER_WAIT_S = 120.0
#: the most ranks the start's check pings (spread over the cluster); the others take no part
CHECKED_RANKS = 8


@dataclass
class StartCheck:
    cluster: Cluster  # this node's view of the run (its rank)
    record: RunRecord
    total_s: float
    line: str = ""  # the master's findings, for the log
    problems: list[str] = field(default_factory=list)
    error: str = ""
    reported: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def begin(cls, cluster: Cluster, record: RunRecord) -> StartCheck | None:
        """Start this node's side in a thread (None when BATON_FS_CHECK_S is 0)."""
        total = FS_CHECK_S.value()
        if total <= 0:
            return None
        check = cls(cluster, record, float(total))
        check._thread = threading.Thread(target=check._run, name="fscheck", daemon=True)
        check._thread.start()
        return check

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self) -> None:
        cluster, record = self.cluster, self.record
        folder, budget, wait = cluster.paths.fscheck, self.total_s / 5, self.total_s * 0.3
        ranks = checked_ranks(record.num_nodes, CHECKED_RANKS)
        try:
            rank = int(cluster.rank or 0)
            if rank != 0:
                if rank in ranks:
                    follow(folder, rank, budget, wait_s=REGISTER_WAIT_S + self.total_s, stop=self._stop)
                return
            deadline = time.monotonic() + REGISTER_WAIT_S
            while len(cluster.nodes()) < record.num_nodes and time.monotonic() < deadline:
                if self._stop.wait(0.5):
                    return
            started = time.monotonic()
            findings = lead(folder, record.num_nodes, budget, wait_s=wait, ranks=ranks)
            path = save_findings(folder, findings)
            took = time.monotonic() - started
            self.line = f"shared filesystem ({took:.1f} s check): {summary(findings)}; {path}"
            self.problems = verdict(findings, record.dead_after_s, record.heartbeat_interval_s)
        except (OSError, ValueError, KeyError) as exc:  # a check that could not run is no verdict on the run
            self.error = f"the shared-filesystem check at the start could not run: {exc}"

    def watch(self) -> None:
        """A supervisor watch: once the master's side is done, log its findings; a verdict ends the run (exit 2)."""
        if self.reported or not self.done:
            return
        self.reported = True
        if self.error:
            say.warn(self.error)
        if self.line:
            say.log(self.line)
        if self.problems:
            raise say.Die(2, "\n".join(self.problems))  # bad input: the liveness settings against this filesystem

    def stop(self) -> None:
        """End a worker's wait for the ping, or the master's for the registrations (the way out)."""
        self._stop.set()
