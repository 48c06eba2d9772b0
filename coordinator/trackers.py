"""Experiment trackers: TensorBoard and Weights & Biases (offline) views of `<log>/metrics.jsonl`.

    trackers = build_trackers(resolved["update"]["tracker"], log_path)   # from run/rank_0/resolved.yaml
    track(log_path, trackers)        # logs every metrics.jsonl record a tracker has not logged yet

run.sh calls `python -m coordinator track --log-path L` on the master after each
iteration's summary (`tracker=tensorboard`, `tracker=wandb` or
`tracker=[tensorboard,wandb]`; `tracker=none`, the default, calls nothing).
Each record becomes scalars at step = its iteration: a rollout's under
`<split>/...` (`train/success_rate`, `test/mean_reward`), the others under their
kind (`training/train_loss`, `promotion/policy_version`,
`iteration/phase_s/update`); nested numbers get their path, strings and lists
are left out.

Exactly once, across reruns and --resume: each tracker keeps a cursor, the byte
offset of metrics.jsonl it has logged up to, in `<log>/trackers/<name>.cursor.json`
(written atomically after the tracker flushed), with the outputs those records
went to. A call that died before its cursor was written left outputs the cursor
does not list; the next call deletes them and logs those records again. Outputs:
TensorBoard event files in `<log>/trackers/tensorboard/` (one per call); W&B one
offline run directory per call in `<log>/trackers/wandb/wandb/`, all of the same
run id (`<log>/trackers/wandb/run_id`), so `wandb sync` uploads them as one run.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollout_engine.files import parse_jsonl, save_json, save_text
from rollout_engine.layout import Layout

log = logging.getLogger(__name__)

#: record keys that are not metrics (the step, the wall time, what the record is about)
NOT_METRICS = frozenset({"kind", "iteration", "time", "split", "rank"})


class Tracker(Protocol):
    """Where metrics go. `logged_to` is the metrics.jsonl offset already logged; `commit` flushes and records it."""

    def logged_to(self) -> int: ...

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None: ...

    def commit(self, offset: int) -> None: ...


class NullTracker:
    """The tracker of `tracker=none`: it has logged everything there is, so nothing reaches it."""

    def logged_to(self) -> int:
        return 2**63 - 1

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        pass

    def commit(self, offset: int) -> None:
        pass


@dataclass
class Cursor:
    """How far one tracker got: metrics.jsonl's byte offset, and the outputs holding what came before it."""

    offset: int = 0
    outputs: list[str] = field(default_factory=list)


def load_cursor(path: Path) -> Cursor:
    """The saved cursor; a missing file is the start."""
    if not path.exists():
        return Cursor()
    data = json.loads(path.read_text())
    return Cursor(int(data["offset"]), list(data.get("outputs", [])))


def save_cursor(path: Path, cursor: Cursor) -> None:
    save_json(path, {"offset": cursor.offset, "outputs": cursor.outputs})


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers as tags: `<split or kind>/<key>[/<nested key>...]`; None, strings, lists left out."""
    kind = str(record.get("kind", "metrics"))
    prefix = str(record.get("split") or kind) if kind == "rollout" else kind
    found: dict[str, float] = {}

    def walk(tag: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{tag}/{key}", inner)
        elif isinstance(value, bool | int | float):
            found[tag] = float(value)

    for key, value in record.items():
        if key not in NOT_METRICS:
            walk(f"{prefix}/{key}", value)
    return found


def read_new(metrics: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete records after byte `offset`, and the offset after the last of them (a torn line is skipped)."""
    if not metrics.exists() or offset >= metrics.stat().st_size:
        return [], offset
    with metrics.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a line still being appended waits for the next call
    read = parse_jsonl(data[:end])
    if read.torn:
        log.warning("%s: skipped torn lines after byte %d: %s", metrics, offset, read.torn)
    return [r for r in read.rows if isinstance(r, dict)], offset + end


def track(log_path: Path, trackers: list[Tracker]) -> int:
    """Give each tracker the records it has not logged yet, in file order; return how many were logged."""
    metrics = Layout(log_path).metrics
    logged = 0
    for tracker in trackers:
        records, end = read_new(metrics, tracker.logged_to())
        for record in records:
            if isinstance(record.get("iteration"), int) and (scalars := scalars_of(record)):
                tracker.log(record["iteration"], scalars, float(record.get("time") or time.time()))
                logged += 1
        if records:
            tracker.commit(end)
    return logged


class TensorBoardTracker:
    """Scalars into TensorBoard event files under `<log>/trackers/tensorboard/` (one file per call).

    `tensorboard --logdir <log>` shows them beside LLaMA-Factory's curves (`training/iter_<NNNN>/tensorboard/`).
    """

    def __init__(self, log_path: str | Path) -> None:
        self.dir = Layout(log_path).trackers / "tensorboard"
        self.cursor_path = Layout(log_path).trackers / "tensorboard.cursor.json"
        self.cursor = load_cursor(self.cursor_path)
        self._writer: Any = None

    def logged_to(self) -> int:
        return self.cursor.offset

    def _open(self) -> Any:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob("events.out.tfevents.*"):
            if stale.name not in self.cursor.outputs:  # an interrupted call's: its records are logged again
                log.warning("removing %s (a tracker call that did not finish)", stale)
                stale.unlink()
        return EventFileWriter(str(self.dir), filename_suffix=f".baton{self.cursor.offset}")

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._writer = self._writer or self._open()
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self._writer.add_event(Event(wall_time=wall_time, step=step, summary=Summary(value=values)))

    def commit(self, offset: int) -> None:
        if self._writer is not None:
            self._writer.close()
            for written in self.dir.glob(f"*.baton{self.cursor.offset}"):  # this call's file (its suffix)
                with written.open("rb") as f:
                    os.fsync(f.fileno())  # on disk before the cursor names it
                self.cursor.outputs.append(written.name)
            self._writer = None
        self.cursor.offset = offset
        save_cursor(self.cursor_path, self.cursor)


class WandbTracker:
    """Scalars into a W&B run (offline by default) under `<log>/trackers/wandb/`; one run id per log path."""

    def __init__(
        self, log_path: str | Path, project: str = "baton", mode: str = "offline", group: str = "", name: str = ""
    ) -> None:
        self.log_path = Path(log_path)
        self.dir = Layout(self.log_path).trackers / "wandb"
        self.cursor_path = Layout(self.log_path).trackers / "wandb.cursor.json"
        self.cursor = load_cursor(self.cursor_path)
        self.project, self.mode = project, mode
        self.group, self.name = group or self.log_path.name, name or self.log_path.name
        self._run: Any = None
        self._rows: dict[int, dict[str, float]] = {}

    def logged_to(self) -> int:
        return self.cursor.offset

    def run_id(self) -> str:
        """The log path's W&B run id (made and saved on first use)."""
        path = self.dir / "run_id"
        if not path.exists():
            save_text(path, uuid.uuid4().hex[:12] + "\n")  # W&B ids: letters and digits
        return path.read_text().strip()

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        # W&B keeps one row per step and drops a step below one it has seen: gather rows, log them in order.
        self._rows.setdefault(step, {}).update(scalars)

    def _discard_stale(self) -> None:
        import shutil

        for stale in (self.dir / "wandb").glob("*-run-*"):
            if stale.is_dir() and stale.name not in self.cursor.outputs:
                log.warning("removing %s (a tracker call that did not finish)", stale)
                shutil.rmtree(stale)

    def commit(self, offset: int) -> None:
        import wandb

        if self._rows:
            self.dir.mkdir(parents=True, exist_ok=True)
            run_id = self.run_id()
            self._discard_stale()
            run = wandb.init(
                dir=str(self.dir),
                id=run_id,
                resume="allow",
                project=self.project,
                group=self.group,
                name=self.name,
                mode=self.mode,
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
            for step in sorted(self._rows):
                run.log(self._rows[step], step=step)
            run_dir = Path(run.dir).parent.name
            run.finish()
            self.cursor.outputs.append(run_dir)
            self._rows = {}
        self.cursor.offset = offset
        save_cursor(self.cursor_path, self.cursor)


def build_trackers(tracker_cfg: dict[str, Any] | None, log_path: str | Path) -> list[Tracker]:
    """The trackers a resolved `tracker` node names (each entry's `_target_`); `[NullTracker()]` for none."""
    from hydra.utils import instantiate

    chosen = [node for node in (tracker_cfg or {}).values() if node]
    if not chosen:
        return [NullTracker()]
    return [instantiate(node, log_path=str(log_path)) for node in chosen]
