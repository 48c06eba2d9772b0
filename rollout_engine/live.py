"""The live view of a rollout and its status.json snapshot.

`run_live` refreshes `<log>/status.json` (`<log>/status.rank_<r>.json` with several ranks)
(in place, every `env_config.status_interval_s` seconds; the last atomically) and the terminal
view chosen by `env_config.live_view`:

- `rich`: a grid with one cell per episode (`.` waiting, `s` setup,
  `g` generating, `e` in the environment, `j` scoring, green `+` success,
  white `-` done without success, red `x` failed) and counters;
- `plain`: one progress line on stderr per refresh when something changed;
  both views' counters line ends with `N replies cut` once a finished episode
  has a reply cut at the token limit (`finish_reason` length);
- `off`: nothing; `auto`: rich on a TTY, else plain.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Protocol

from rollout_engine.files import overwrite_text, save_json
from rollout_engine.progress import Progress

_GLYPHS = {
    "waiting": (".", "dim"),
    "setup": ("s", "cyan"),
    "generating": ("g", "yellow"),
    "env": ("e", "blue"),
    "scoring": ("j", "magenta"),
    "failed": ("x", "red"),
}


class View(Protocol):
    def update(self, snap: dict[str, Any]) -> None: ...

    def stop(self) -> None: ...


class NullView:
    """No terminal output."""

    def update(self, snap: dict[str, Any]) -> None:
        return None

    def stop(self) -> None:
        return None


def progress_line(snap: dict[str, Any]) -> str:
    counts = snap["counts"]
    running = sum(counts[s] for s in ("setup", "generating", "env", "scoring"))
    failed = ", ".join(f"{k} {v}" for k, v in sorted(snap["failures"].items())) or "none"
    cut = snap.get("truncated_turns", 0)
    return (
        f"[rollout] {snap['finished']}/{snap['planned'] - snap['skipped_resumed']} finished, "
        f"{running} running, {counts['waiting']} waiting, {snap['successes']} successes, "
        f"failures: {failed}, {f'{cut} replies cut, ' if cut else ''}{snap['elapsed_s']:.0f}s"
    )


class PlainView:
    """One progress line on stderr whenever the counts change."""

    def __init__(self) -> None:
        self.last = ""

    def update(self, snap: dict[str, Any]) -> None:
        line = progress_line(snap)
        if line.rsplit(",", 1)[0] != self.last.rsplit(",", 1)[0]:
            print(line, file=sys.stderr, flush=True)
            self.last = line

    def stop(self) -> None:
        return None


class RichView:
    """A rich Live panel: counters and one cell per episode."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.live = Live(console=Console(stderr=True), refresh_per_second=4, transient=False)
        self.live.start()

    def update(self, snap: dict[str, Any]) -> None:
        from rich.console import Group
        from rich.text import Text

        grid = Text()
        for index, cell in enumerate(snap["cells"]):
            if cell["state"] == "done":
                grid.append("+" if cell["success"] else "-", style="green" if cell["success"] else "white")
            else:
                glyph, style = _GLYPHS.get(cell["state"], ("?", "white"))
                grid.append(glyph, style=style)
            if index % 80 == 79:
                grid.append("\n")
        self.live.update(Group(Text(progress_line(snap), style="bold"), grid))

    def stop(self) -> None:
        self.live.stop()


def build_view(mode: str) -> View:
    if mode == "off":
        return NullView()
    if mode == "rich" or (mode == "auto" and sys.stderr.isatty()):
        return RichView()
    return PlainView()


async def run_live(progress: Progress, view: View, status_path: Path, interval_s: float) -> None:
    """Refresh status.json and the view until cancelled (then one last refresh)."""
    try:
        while True:
            snap = progress.snapshot()
            await asyncio.to_thread(write_status, status_path, snap)
            view.update(snap)
            await asyncio.sleep(interval_s)
    finally:
        snap = progress.snapshot()
        write_status(status_path, snap, final=True)
        view.update(snap)
        view.stop()


def write_status(path: Path, snap: dict, final: bool = False) -> None:
    """Rewrite status.json in place, no fsync (rollout_engine.files.overwrite_text: a create and a rename a second
    on every node were most of a large cluster's metadata load; the next second's snapshot replaces one torn or
    lost); the last one (`final`) replaces it atomically and durably."""
    if final:
        save_json(path, snap)
    else:
        overwrite_text(path, json.dumps(snap, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
