"""`<log>/metrics.jsonl` and the update's own file beside it: one writer each, one merge.

    append_update(log, record)   # the update (its node 0): training, promotion, revert -> metrics/update.jsonl
    merge_update(log)            # the master of a run that rolls out: copies them into metrics.jsonl
    rows = load_metrics(log)     # every record: metrics.jsonl's, then the update's not merged yet

metrics.jsonl is appended on one host, one process at a time: a single node's rollout, then the master's
driver (the merged rollout records, the iteration record, the update's records it merges). A split
deployment's update run may be on another host, and two hosts appending to one file can interleave their
lines, with no lock shared between them on every filesystem (docs/multinode.md "Filesystems"). So the
update writes a file of its own and numbers its records (`update_seq`), and the merge copies those above
the highest number metrics.jsonl holds: a crash mid-merge neither loses a record nor repeats one. Until a
merge (an update run alone, or the last update after its rollout run ended) `load_metrics` adds them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rollout_engine.files import append_line, append_shared_line, parse_jsonl
from rollout_engine.layout import Layout

log = logging.getLogger(__name__)

#: the number the update gives each of its records (1, 2, ...), kept when merged
SEQ = "update_seq"


def _complete_rows(path: Path) -> list[dict[str, Any]]:
    """The records of the complete lines of `path` (a line still being appended by another host is left for
    the next read; a torn line is skipped with a warning)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    read = parse_jsonl(data[: data.rfind(b"\n") + 1])
    if read.torn:
        log.warning("%s: skipped torn lines %s", path, read.torn)
    return [row for row in read.rows if isinstance(row, dict)]


def _highest(rows: list[dict[str, Any]]) -> int:
    return max((row[SEQ] for row in rows if isinstance(row.get(SEQ), int)), default=0)


def append_update(log_path: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one of the update's records to `metrics/update.jsonl`, numbered after the last; return it.
    Its one writer is the update's node 0 (one update run per log path: the role claim and the fence)."""
    path = Layout(log_path).update_metrics
    path.parent.mkdir(parents=True, exist_ok=True)
    numbered = {**record, SEQ: _highest(_complete_rows(path)) + 1}
    append_line(path, json.dumps(numbered, ensure_ascii=False))
    return numbered


def _unmerged(layout: Layout, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = _highest(rows)
    return [row for row in _complete_rows(layout.update_metrics) if isinstance(row.get(SEQ), int) and row[SEQ] > merged]


def merge_update(log_path: str | Path) -> int:
    """Copy the update's records that metrics.jsonl lacks into it, in their order; return how many. Only
    the process that appends to metrics.jsonl calls it (a run's master that rolls out, at each step's end)."""
    layout = Layout(log_path)
    new = _unmerged(layout, _complete_rows(layout.metrics))
    for row in new:
        append_shared_line(layout.metrics, json.dumps(row, ensure_ascii=False))
    return len(new)


def load_metrics(log_path: str | Path) -> list[dict[str, Any]]:
    """Every record of the run: metrics.jsonl's complete lines, then the update's records not merged yet."""
    layout = Layout(log_path)
    rows = _complete_rows(layout.metrics)
    return rows + _unmerged(layout, rows)
