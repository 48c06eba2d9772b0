"""run.sh's live view of a running phase, read from the log path (so every rank shows, on any node).

    python -m coordinator watch --log-path L --phase rollout-train --iteration 3   # until SIGTERM

On a terminal: a live block, one line per rank of the rollout (episodes done /
planned, successes, failures and replies cut at the token limit when there are
any, tokens/s, elapsed, ETA) or the training (step / total,
loss, elapsed, ETA), and any trouble in red with what to do; when the phase
ends, its final numbers stay as plain lines. Otherwise (CI,
a log file): the same lines at most every `--every` seconds (30), only when
they changed, a trouble line once when it appears, and the final numbers when
it is stopped. run.sh starts it beside each rollout and update (and the barrier
after it: a node that finished sees the others) as a tracked process group and
stops it (SIGTERM) when the phase ends.

With several nodes (`--rank`), the master's view reads every rank every
TOTALS_S and writes their totals (coordinator/clusterview.py); a worker's view
shows its own rank live and the cluster's totals from that one file, so that
the views cost the filesystem O(1) a second on a worker, not O(ranks).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from coordinator.clusterview import TOTALS_S, ClusterTotals, Totals, read_totals, totals, write_totals
from coordinator.runview import RankRollout, RunView, StallWatch, TrainProgress, Trouble

PHASES = ("rollout-train", "rollout-test", "update")
#: the master's terminal shows a line per rank up to this many ranks; beyond, its own line and the totals
RANK_LINES = 16


def duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s`, `42s`; `?` when unknown."""
    if seconds is None:
        return "?"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def rollout_line(r: RankRollout) -> str:
    who = "" if r.rank is None else f" rank {r.rank}"
    rate = 100.0 * r.successes / r.finished if r.finished else 0.0
    resumed = f" (+{r.resumed} resumed)" if r.resumed else ""
    failed = sum(r.failures.values())
    cut = f", {r.truncated_turns} replies cut" if r.truncated_turns else ""
    return (
        f"{r.split} rollout{who}: {r.finished}/{r.todo} episodes{resumed}, {r.successes} successes ({rate:.1f} %)"
        f"{f', {failed} failed' if failed else ''}{cut}, {r.tokens_per_s:.1f} tok/s, "
        f"{duration(r.elapsed_s)} {'in all' if r.done else f'elapsed, ETA {duration(r.eta_s)}'}"
    )


def totals_line(t: Totals) -> str:
    rate = 100.0 * t.successes / t.finished if t.finished else 0.0
    return (
        f"{t.split} rollout, {t.ranks} ranks: {t.finished}/{t.todo} episodes, {t.successes} successes ({rate:.1f} %)"
        f"{f', {t.failed} failed' if t.failed else ''}, {t.tokens_per_s:.1f} tok/s, {t.done}/{t.ranks} ranks done, "
        f"ETA {duration(t.eta_s)}"
    )


def train_line(t: TrainProgress) -> str:
    loss = "?" if t.loss is None else f"{t.loss:.4f}"
    done = t.total_steps > 0 and t.step >= t.total_steps
    return (
        f"update: step {t.step}/{t.total_steps}, loss {loss}, {duration(t.elapsed_s)} "
        f"{'in all' if done else f'elapsed, ETA {duration(t.remaining_s)}'}"
    )


@dataclass
class Frame:
    """What the view shows at one moment."""

    lines: list[str] = field(default_factory=list)
    troubles: list[Trouble] = field(default_factory=list)


def build_frame(view: RunView, stalls: StallWatch, phase: str, iteration: int) -> Frame:
    frame = Frame()
    if phase == "update":
        training = view.training(iteration)
        frame.lines.append(train_line(training) if training else "update: preparing (no training step logged yet)")
        frame.troubles = stalls.observe(view, rollouts=[])
        return frame
    split = phase.removeprefix("rollout-")
    rollouts = [r for r in view.rollouts() if r.split == split and r.iteration == iteration]
    frame.lines = [rollout_line(r) for r in rollouts] or [f"{split} rollout: starting"]
    frame.troubles = stalls.observe(view, rollouts=rollouts)
    return frame


class NodeView:
    """What one node's view reads each second: everything on a single node (rank None); on several, the master
    every rank every TOTALS_S (writing their totals) and its own status in between; a worker its own status and
    the master's totals, by name."""

    def __init__(self, log: Path, phase: str, iteration: int, rank: int | None = None, clock=time.monotonic) -> None:
        self.log, self.phase, self.iteration, self.clock = log, phase, iteration, clock
        self.view, self.stalls = RunView(log), StallWatch(clock=clock)
        self.rank = rank if rank is not None and self.view.num_nodes() > 1 else None  # the run record: once
        self.split = phase.removeprefix("rollout-")
        self._full_at: float | None = None
        self._rollouts: list[RankRollout] = []
        self._troubles: list[Trouble] = []
        self._totals: ClusterTotals | None = None
        self._own: RankRollout | None = None
        self._totals_at: float | None = None

    def frame(self) -> Frame:
        if self.rank is None:
            return build_frame(self.view, self.stalls, self.phase, self.iteration)
        return self._master() if self.rank == 0 else self._worker()

    def final(self) -> Frame:
        """The frame when the view is stopped (after the phase's barrier): read afresh, not the last look's
        cache, so that the lines a log keeps are every rank's final numbers."""
        self._full_at = self._totals_at = None
        self._own = None
        return self.frame()

    def _mine(self, rollout: RankRollout | None) -> bool:
        return rollout is not None and (rollout.split, rollout.iteration) == (self.split, self.iteration)

    def _master(self) -> Frame:
        now = self.clock()
        if self._full_at is None or now - self._full_at >= TOTALS_S:
            self._full_at = now
            if self.phase == "update":
                self._rollouts = []
                self._troubles = self.stalls.observe(self.view, rollouts=[])
            else:
                found = self.view.rollouts()
                self._rollouts = [r for r in found if (r.split, r.iteration) == (self.split, self.iteration)]
                self._troubles = self.stalls.observe(self.view, rollouts=self._rollouts)
            write_totals(self.log, self._rollouts, self._troubles, time.time())
        elif self.phase != "update":  # its own rank live between the looks at every rank
            own = self.view.rollout(0)
            if self._mine(own):
                self._rollouts = [own if r.rank == 0 else r for r in self._rollouts] or [own]  # type: ignore[misc]
        return self._lines(self._rollouts, self._troubles, len(self._rollouts) <= RANK_LINES)

    def _worker(self) -> Frame:
        now = self.clock()
        if self._totals_at is None or now - self._totals_at >= TOTALS_S / 2:  # they change every TOTALS_S
            self._totals_at, self._totals = now, read_totals(self.log)
        found = self._totals
        theirs = [] if found is None else [t for t in found.troubles if t.rank != self.rank]
        if self.phase == "update":
            return self._lines([], theirs, True)
        own = self._own
        if own is None or not own.done:  # a finished rollout's status no longer changes (its barrier's wait)
            own = self._own = self.view.rollout(self.rank)  # type: ignore[arg-type]
        mine = [own] if own is not None and self._mine(own) else []
        troubles = self.stalls.observe(self.view, rollouts=mine, beats=False) + theirs
        frame = self._lines(mine, troubles, True)
        here = (self.split, self.iteration)
        frame.lines += [totals_line(t) for t in (found.rollouts if found else []) if (t.split, t.iteration) == here]
        return frame

    def _lines(self, rollouts: list[RankRollout], troubles: list[Trouble], every_rank: bool) -> Frame:
        shown = rollouts if every_rank else [r for r in rollouts if r.rank == self.rank]
        lines = [rollout_line(r) for r in shown]
        if self.phase == "update":
            training = self.view.training(self.iteration)
            lines = [train_line(training) if training else "update: preparing (no training step logged yet)"]
        elif not every_rank:
            lines += [totals_line(t) for t in totals(rollouts)]
        return Frame(lines or [f"{self.split} rollout: starting"], troubles)


def view_loop(source: NodeView, show: Callable[[Frame], None], poll_s: float = 1.0) -> None:
    """Show `source`'s frame every `poll_s` until stopped (SIGTERM raises out of the sleep)."""
    while True:
        show(source.frame())
        time.sleep(poll_s)


class Output(Protocol):
    def show(self, frame: Frame) -> None: ...

    def close(self, last: Frame) -> None: ...


class PlainOutput:
    """Lines on a stream that is not a terminal: at most every `every_s`, only when changed; troubles once."""

    def __init__(self, stream: TextIO, every_s: float, clock=time.monotonic) -> None:
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self.shown: list[str] = []
        self.at = clock()  # the phase's own start line was just printed: the first progress comes a period later
        self.told: set[str] = set()

    def show(self, frame: Frame) -> None:
        for trouble in frame.troubles:
            key = f"{trouble.rank}:{trouble.what.split(' for ')[0]}"
            if key not in self.told:
                self.told.add(key)
                self._print(f"[baton] trouble: {trouble.line()}")
        if frame.lines != self.shown and self.clock() - self.at >= self.every_s:
            for line in frame.lines:
                self._print(f"[baton] {line}")
            self.shown, self.at = list(frame.lines), self.clock()

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def close(self, last: Frame) -> None:
        """The phase ended: its final numbers, unless just shown (so a log always has them)."""
        if last.lines != self.shown:
            for line in last.lines:
                self._print(f"[baton] {line}")


class LiveOutput:
    """A rich Live block on a terminal, redrawn in place; when the phase ends it gives way to the final numbers
    as plain lines (the terminal's history keeps them)."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.stream = stream
        self.live = Live(console=Console(file=stream), refresh_per_second=2, transient=True)
        self.live.start()

    def show(self, frame: Frame) -> None:
        from rich.text import Text

        text = Text()
        for line in frame.lines:
            text.append(f"[baton] {line}\n", style="bold")
        for trouble in frame.troubles:
            text.append(f"[baton] trouble: {trouble.line()}\n", style="red")
        text.rstrip()
        self.live.update(text)

    def close(self, last: Frame) -> None:
        self.live.stop()
        for line in last.lines:
            print(f"[baton] {line}", file=self.stream, flush=True)


def build_output(stream: TextIO, every_s: float, live: bool | None = None) -> Output:
    return LiveOutput(stream) if (stream.isatty() if live is None else live) else PlainOutput(stream, every_s)


def run_watch(
    log_path: Path, phase: str, iteration: int, every_s: float, poll_s: float = 1.0, rank: int | None = None
) -> int:
    """Show the phase until SIGTERM / SIGINT (then exit 0, leaving the terminal clean)."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    source = NodeView(log_path, phase, iteration, rank)
    output = build_output(sys.stderr, every_s)
    try:
        view_loop(source, output.show, poll_s)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # run.sh's one SIGTERM: let the last frame out
        output.close(source.final())
