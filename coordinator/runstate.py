"""The one reader of a run's iteration state, `<log>/run/state/iter_<NNNN>/` (docs/cli.md).

    state_iterations(log)              # [1, 2, 3]: iterations with a state folder
    next_iteration(log)                # the one to run now (the driver's loop and dry run)
    load_markers(log, 3)               # {"train_rollout": "1795503157", "update": "promoted v3", ...}
    load_times(log, 3)                 # [("train_rollout", 41.2), ...]: one pair per line of `times`
    phase_times(log, 3)                # {"train_rollout": 41.2, ...}: seconds summed per phase

    is_done(log, 3, "update")          # its marker exists
    mark(log, 3, "update", "promoted v3")   # the driver's writes: atomic markers,
    add_time(log, 3, "update", 41)          # appended times,
    restart(log, 3)                    # and an interrupted iteration started again

The files: `<phase>.done` (its content: what the phase did, or only the Unix
time it finished) and `times` ("<phase> <seconds>" lines). Reads never fail: a
file that vanishes or does not parse is left out (the run may be rewriting it).
"""

from __future__ import annotations

import time
from pathlib import Path

from rollout_engine.files import save_text
from rollout_engine.layout import MARKER_SUFFIX, Layout, iterations
from rollout_engine.shared_read import make_dirs


def state_iterations(log: str | Path) -> list[int]:
    """Iterations with a state folder, ascending. The listing is followed by lookups of the next numbers by
    name: another host's new folder (a split deployment's rollout master's, read by its update run) can be
    missing from a cached listing for 20 s (sshfs) while a lookup by name sees it at once."""
    layout = Layout(log)
    found = [n for n, path in iterations(layout.state_root) if path.is_dir()]
    while layout.state_dir((found[-1] if found else 0) + 1).is_dir():
        found.append((found[-1] if found else 0) + 1)
    return found


def next_iteration(log: str | Path) -> int:
    """The iteration a run starts now: the last one while it is unfinished, else the next."""
    last = max(state_iterations(log), default=0)
    return last + 1 if last == 0 or Layout(log).marker(last, "iteration").exists() else last


def load_markers(log: str | Path, iteration: int) -> dict[str, str]:
    """{phase: content, stripped} of every `<phase>.done` of the iteration."""
    found = {}
    for path in sorted(Layout(log).state_dir(iteration).glob(f"*{MARKER_SUFFIX}")):
        try:
            found[path.name.removesuffix(MARKER_SUFFIX)] = path.read_text().strip()
        except OSError:
            continue
    return found


def load_times(log: str | Path, iteration: int) -> list[tuple[str, float]]:
    """(phase, seconds) per well-formed line of the iteration's `times`, in order."""
    try:
        lines = Layout(log).times(iteration).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        name, _, seconds = line.partition(" ")
        try:
            out.append((name, float(seconds)))
        except ValueError:
            continue
    return out


def phase_times(log: str | Path, iteration: int) -> dict[str, float]:
    """Seconds per phase of the iteration (a phase run twice, e.g. a retried update, sums)."""
    times: dict[str, float] = {}
    for name, seconds in load_times(log, iteration):
        times[name] = times.get(name, 0.0) + seconds
    return times


def is_done(log: str | Path, iteration: int, phase: str) -> bool:
    return Layout(log).marker(iteration, phase).is_file()


def mark(log: str | Path, iteration: int, phase: str, content: str = "") -> None:
    """Record that `phase` of `iteration` finished (atomically), with what it did or the time."""
    marker = Layout(log).marker(iteration, phase)
    make_dirs(marker.parent)
    save_text(marker, (content or str(int(time.time()))) + "\n")


def add_time(log: str | Path, iteration: int, phase: str, seconds: float) -> None:
    """Append how long `phase` took (one short line: an append of it is whole)."""
    path = Layout(log).times(iteration)
    make_dirs(path.parent)
    with open(path, "a") as out:
        out.write(f"{phase} {int(seconds)}\n")


def restart(log: str | Path, iteration: int) -> bool:
    """Forget the finished phases of an interrupted `iteration` so that it runs again from the start
    (its journals are moved aside by the rollout engine, never overwritten); True when there were some."""
    folder = Layout(log).state_dir(iteration)
    markers = list(folder.glob(f"*{MARKER_SUFFIX}")) if folder.is_dir() else []
    for path in [*markers, Layout(log).times(iteration)] if markers else []:
        path.unlink(missing_ok=True)
    return bool(markers)


def eval_due(iteration: int, interval: int) -> bool:
    """Iteration `iteration` evaluates on the held-out tasks (n % interval == 1; interval 1: every one)."""
    return interval == 1 or iteration % interval == 1
