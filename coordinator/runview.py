"""What a run's log path says about where it stands, read-only: rollouts per rank, training, trouble.

    view = RunView(Path(log))
    view.rollouts()                 # [RankRollout]: one per status.json / status.rank_<r>.json
    view.training(3)                # TrainProgress of iteration 3 (LLaMA-Factory's trainer_log.jsonl), or None
    view.heartbeats()               # {rank: Beat} of the current multi-node run
    StallWatch().observe(view)      # [Trouble], each with what to do (call it again and again: it keeps time)

run.sh's terminal view (`python -m coordinator watch`) and the dashboard read
the run through this module only, and never write under the log path. Other
hosts' clocks are never compared with ours: a rank is silent or stalled when
what it wrote has not changed for a while on this process's monotonic clock
(as the heartbeats are judged, coordinator/heartbeat.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.cluster import Cluster, load_run
from coordinator.heartbeat import Beat, read_beats
from rollout_engine.defaults import BEAT_TROUBLE_S, POLICY_RESTARTS
from rollout_engine.files import read_jsonl
from rollout_engine.layout import Layout

_STATUS = re.compile(r"status(?:\.rank_(\d+))?\.json")
_CLOCK = re.compile(r"(?:(\d+):)?(\d+):(\d+)")


@dataclass(frozen=True)
class RankRollout:
    """One rank's running (or last) rollout, from its status file."""

    rank: int | None  # None: a single node's status.json
    split: str | None
    iteration: int | None
    planned: int  # this rollout's episodes, those resumed from the journal included
    resumed: int  # already in the journal when it started
    finished: int
    successes: int
    running: int
    failures: dict[str, int]
    completion_tokens: int
    elapsed_s: float
    updated_at: float  # the writer's clock: an identity of the snapshot, never compared with ours
    cells: list[dict[str, Any]] = field(default_factory=list)
    policy_down: str | None = None  # the rollout stopped: the policy server stopped answering
    truncated_turns: int = 0  # replies of the finished episodes cut at the token limit (finish_reason length)

    @property
    def todo(self) -> int:
        return self.planned - self.resumed

    @property
    def done(self) -> bool:
        return self.finished >= self.todo

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far (None before the first episode ends)."""
        if self.done:
            return 0.0
        if self.finished == 0 or self.elapsed_s <= 0:
            return None
        return (self.todo - self.finished) * self.elapsed_s / self.finished

    @classmethod
    def parse(cls, snap: dict[str, Any], rank: int | None) -> RankRollout:
        counts = snap.get("counts", {})
        return cls(
            rank=snap.get("rank", rank) if rank is not None else None,
            split=snap.get("split"),
            iteration=snap.get("iteration"),
            planned=int(snap.get("planned", 0)),
            resumed=int(snap.get("skipped_resumed", 0)),
            finished=int(snap.get("finished", 0)),
            successes=int(snap.get("successes", 0)),
            running=sum(int(counts.get(s, 0)) for s in ("setup", "generating", "env", "scoring")),
            failures=dict(snap.get("failures", {})),
            completion_tokens=int(snap.get("completion_tokens", 0)),
            elapsed_s=float(snap.get("elapsed_s", 0.0)),
            updated_at=float(snap.get("updated_at", 0.0)),
            cells=list(snap.get("cells", [])),
            policy_down=snap.get("policy_down"),
            truncated_turns=int(snap.get("truncated_turns", 0)),
        )


@dataclass(frozen=True)
class TrainProgress:
    """One iteration's training, from LLaMA-Factory's trainer_log.jsonl (written by node 0)."""

    iteration: int
    step: int
    total_steps: int
    loss: float | None  # the last logged loss
    elapsed_s: float | None
    remaining_s: float | None
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) of every logged step


@dataclass(frozen=True)
class Trouble:
    """Something a person watching the run should act on."""

    rank: int | None
    what: str
    fix: str

    def line(self) -> str:
        who = "" if self.rank is None else f"rank {self.rank}: "
        return f"{who}{self.what}; {self.fix}"


def clock_s(text: Any) -> float | None:
    """LLaMA-Factory's "H:MM:SS" (or "MM:SS") in seconds; None when it is not one."""
    match = _CLOCK.fullmatch(str(text).strip())
    if not match:
        return None
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600.0 + minutes * 60.0 + seconds


class RunView:
    """Reads one log path; every method reads the files anew."""

    def __init__(self, log_path: Path) -> None:
        self.log = Path(log_path)

    def rollouts(self) -> list[RankRollout]:
        """Every rank's status file, by rank (a file that is missing or being replaced is left out). The ranks
        of the current runs are looked up by name as well as listed: a cached listing (sshfs: 20 s) can lack
        another node's new file."""
        found: list[RankRollout] = []
        names = {path.name for path in self.log.glob("status*.json")}
        names |= {Layout(self.log).status(rank).name for rank in range(self.num_nodes())}
        for path in sorted(self.log / name for name in names):
            match = _STATUS.fullmatch(path.name)
            if not match:
                continue
            try:
                snap = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            found.append(RankRollout.parse(snap, int(match.group(1)) if match.group(1) else None))
        return sorted(found, key=lambda r: -1 if r.rank is None else r.rank)

    def rollout(self, rank: int) -> RankRollout | None:
        """One rank's status file, by name alone (a worker's view of itself: one read, whatever the ranks)."""
        try:
            snap = json.loads(Layout(self.log).status(rank).read_bytes())
        except (OSError, ValueError):  # not written yet, or being replaced: the next look sees it
            return None
        return RankRollout.parse(snap, rank)

    def training(self, iteration: int) -> TrainProgress | None:
        path = Layout(self.log).training_dir(iteration) / "output" / "trainer_log.jsonl"
        if not path.exists():
            return None
        rows = [r for r in read_jsonl(path).rows if isinstance(r, dict)]
        if not rows:
            return None
        last = rows[-1]
        losses = [(int(r.get("current_steps", 0)), float(r["loss"])) for r in rows if _number(r.get("loss"))]
        return TrainProgress(
            iteration=iteration,
            step=int(last.get("current_steps", 0)),
            total_steps=int(last.get("total_steps", 0)),
            loss=losses[-1][1] if losses else None,
            elapsed_s=clock_s(last.get("elapsed_time")),
            remaining_s=clock_s(last.get("remaining_time")),
            losses=losses,
        )

    def protocol_roots(self) -> list[Path]:
        """Where a multi-node run's protocol files are: the log path (a both run) and `roles/<role>/`."""
        roles = [p.parent.parent for p in self.log.glob("roles/*/cluster/run.json")]
        return [root for root in [self.log, *roles] if Layout(root).run_record.exists()]

    def num_nodes(self) -> int:
        """The most nodes of a current multi-node run on this log path (0: none, or a single node)."""
        counts = [0]
        for root in self.protocol_roots():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                record = load_run(root)
                counts.append(record.num_nodes if record is not None else 0)
        return max(counts)

    def heartbeats(self) -> dict[int, Beat]:
        """The current run's heartbeats (of every protocol root: a split deployment has two)."""
        beats: dict[int, Beat] = {}
        for root in self.protocol_roots():
            try:
                record = load_run(root)
                found = read_beats(Cluster(root, record.run_id)) if record is not None else {}
            except (OSError, ValueError, KeyError, TypeError):
                continue
            beats.update(found)
        return beats


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class _Seen:
    value: Any
    since: float  # our monotonic clock when the value last changed (or was first seen)


@dataclass
class StallWatch:
    """Trouble judged over time on this process's clock: a rank whose status file stopped changing, a
    rollout where no episode finished for a while, a heartbeat that stopped changing."""

    silent_s: float = 60.0  # a running rollout rewrites its status every second
    no_finish_s: float = 300.0
    beat_s: float = BEAT_TROUBLE_S
    clock: Any = time.monotonic
    _status: dict[Any, _Seen] = field(default_factory=dict)
    _finished: dict[Any, _Seen] = field(default_factory=dict)
    _beats: dict[int, _Seen] = field(default_factory=dict)

    def _note(self, table: dict, key: Any, value: Any, now: float) -> float:
        seen = table.get(key)
        if seen is None or seen.value != value:
            table[key] = seen = _Seen(value, now)
        return now - seen.since

    def observe(self, view: RunView, rollouts: list[RankRollout] | None = None, beats: bool = True) -> list[Trouble]:
        """Trouble with `rollouts` (default: every rank's, read now) and (`beats`) every rank's heartbeat."""
        now = self.clock()
        troubles: list[Trouble] = []
        for rollout in view.rollouts() if rollouts is None else rollouts:
            if rollout.policy_down:
                troubles.append(
                    Trouble(
                        rollout.rank,
                        f"the policy server stopped answering during its {rollout.split} rollout "
                        f"({rollout.policy_down})",
                        f"run.sh restarts vLLM and resumes the rollout (at most BATON_POLICY_RESTARTS times, "
                        f"{POLICY_RESTARTS.default:g}); if it "
                        f"keeps failing, read {Layout(view.log).logs_dir(rollout.rank or 0)}/vllm.log (often memory)",
                    )
                )
                continue
            if rollout.done:
                continue
            key = (rollout.rank, rollout.split, rollout.iteration)
            quiet = self._note(self._status, key, rollout.updated_at, now)
            idle = self._note(self._finished, key, rollout.finished, now)
            logs = Layout(view.log).logs_dir(rollout.rank or 0)
            if quiet >= self.silent_s:
                troubles.append(
                    Trouble(
                        rollout.rank,
                        f"its {rollout.split} rollout has not updated its status for {quiet:.0f}s",
                        f"the rollout engine is stopped, hung or its node is gone: see {logs}/",
                    )
                )
            elif idle >= self.no_finish_s:
                troubles.append(
                    Trouble(
                        rollout.rank,
                        f"no {rollout.split} episode finished for {int(idle // 60)} min ({rollout.running} running)",
                        f"check that the policy server answers (its log: {logs}/vllm.log) and "
                        "env_config.episode_timeout_s",
                    )
                )
        for rank, beat in (view.heartbeats() if beats else {}).items():
            quiet = self._note(self._beats, rank, (beat.seq, beat.pid), now)
            if quiet >= self.beat_s:
                troubles.append(
                    Trouble(
                        rank,
                        f"its heartbeat (host {beat.host}, pid {beat.pid}) has not changed for {quiet:.0f}s",
                        "that node's run.sh may be stopped or its host down; the master stops the run (or, with "
                        "--on-rank-failure continue, evicts it) once BATON_DEAD_AFTER_S passes",
                    )
                )
        return troubles
