"""The master's terminal view of every rank, in totals, for the other nodes' views: `status.totals.json`.

    write_totals(log, rollouts, troubles)      # the master's view, every TOTALS_S
    found = read_totals(log)                   # a worker's view: one read by name; None before the first
    found.rollouts[0].finished, found.troubles

Every node runs a terminal view (coordinator/watch.py). When each read every rank's status file and heartbeat
every second, the views alone cost the filesystem 2N calls a second on each node, 2N² over the cluster (37,000 a
second at 128 nodes). Now only the master's view reads every rank (every TOTALS_S), and writes what the others
need of them here; a worker's view reads its own status file and this one: O(1) a second. Written atomically
without fsync (a copy lost in a crash is replaced TOTALS_S later), read by name without a listing (a missing or
just-replaced file shows no totals this second; the next second's read sees it).
"""

from __future__ import annotations

import errno
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator.runview import RankRollout, Trouble
from rollout_engine.files import save_json
from rollout_engine.layout import Layout

#: how often the master's view reads every rank and rewrites the totals (s): a person reads a terminal line of
#: hundreds of ranks no faster (its own rank is read every second)
TOTALS_S = 10.0
#: the troubles the totals carry at most (the master's terminal shows them all)
MAX_TROUBLES = 20


@dataclass(frozen=True)
class Totals:
    """One rollout (split, iteration) summed over the ranks that report it."""

    split: str | None
    iteration: int | None
    ranks: int
    done: int  # ranks whose rollout finished
    todo: int
    finished: int
    successes: int
    failed: int
    running: int
    tokens_per_s: float
    eta_s: float | None  # the slowest rank's


@dataclass(frozen=True)
class ClusterTotals:
    rollouts: list[Totals] = field(default_factory=list)
    troubles: list[Trouble] = field(default_factory=list)
    written: float = 0.0  # the master's wall clock: for people, never compared with ours


def totals(rollouts: list[RankRollout]) -> list[Totals]:
    """The ranks' rollouts summed per (split, iteration), in the order first seen."""
    groups: dict[tuple[str | None, int | None], list[RankRollout]] = {}
    for rollout in rollouts:
        groups.setdefault((rollout.split, rollout.iteration), []).append(rollout)
    found = []
    for (split, iteration), group in groups.items():
        etas = [r.eta_s for r in group]
        found.append(
            Totals(
                split=split,
                iteration=iteration,
                ranks=len(group),
                done=sum(r.done for r in group),
                todo=sum(r.todo for r in group),
                finished=sum(r.finished for r in group),
                successes=sum(r.successes for r in group),
                failed=sum(sum(r.failures.values()) for r in group),
                running=sum(r.running for r in group),
                tokens_per_s=sum(r.tokens_per_s for r in group),
                eta_s=None if any(eta is None for eta in etas) else max(etas, default=0.0),  # type: ignore[type-var]
            )
        )
    return found


def write_totals(log: Path, rollouts: list[RankRollout], troubles: list[Trouble], now: float) -> None:
    data = {
        "rollouts": [asdict(t) for t in totals(rollouts)],
        "troubles": [asdict(t) for t in troubles[:MAX_TROUBLES]],
        "written": now,
    }
    save_json(Layout(log).status_totals, data, durable=False)


def read_totals(log: Path) -> ClusterTotals | None:
    """The master's latest totals; None when there are none (yet) or they cannot be read this time."""
    try:
        data: dict[str, Any] = json.loads(Layout(log).status_totals.read_bytes())
        return ClusterTotals(
            [Totals(**t) for t in data.get("rollouts", [])],
            [Trouble(**t) for t in data.get("troubles", [])],
            float(data.get("written", 0.0)),
        )
    except FileNotFoundError:
        return None
    except OSError as exc:  # a stale handle on the file just replaced: not this second
        if exc.errno != errno.ESTALE:
            raise
        return None
    except (ValueError, TypeError):
        return None
