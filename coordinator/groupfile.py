"""A node's process-group records: `run/rank_<r>/groups.json` (docs/formats.md), one file a rank.

    records = read(Layout(log).groups(rank))    # {"vllm": Record(pgid=1234, start="98765"), ...}; {} without it
    data = encode(records)                      # what the driver writes (coordinator/driver/procs.py Groups)

Each record names a process group the node's run.sh started and that runs now: its id (the leader's pid) and
the leader's start time (field 22 of /proc/<pid>/stat, clock ticks since boot), which with the pid names one
process even after the pid is reused; and `holds`, where the group holds something a later run must know (vLLM:
the model folder whose weights it serves), so that the note ends with the group. One file a rank, rewritten in
place under its lock, where a file a group made a create and an unlink on the shared path at every start of a
phase on every node.

A reader takes the first JSON object of the file and ignores what follows it: a rewrite that shortened the
file shows, until its cut, the old bytes' tail after the new object. An empty file (made an instant ago)
holds no records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    """A recorded group: its id, its leader's start time ("" when it was not known) and what it holds ("": nothing
    noted)."""

    pgid: int
    start: str
    holds: str = ""


def parse(data: bytes) -> dict[str, Record] | None:
    """The records of a file's bytes; None for bytes that hold no records object (not a file this module wrote)."""
    text = data.decode("utf-8", "replace").lstrip()
    if not text:
        return {}
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    records = {}
    for name, value in obj.items():
        pgid = value.get("pgid") if isinstance(value, dict) else None
        if isinstance(pgid, int) and not isinstance(pgid, bool):
            records[name] = Record(pgid, str(value.get("start", "")), str(value.get("holds", "")))
    return records


def encode(records: dict[str, Record]) -> bytes:
    """The file's bytes: one line a group, sorted by name."""
    lines = [f" {json.dumps(name)}: {json.dumps(_fields(r))}" for name, r in sorted(records.items())]
    return ("{\n" + ",\n".join(lines) + ("\n" if lines else "") + "}\n").encode()


def _fields(record: Record) -> dict[str, int | str]:
    fields: dict[str, int | str] = {"pgid": record.pgid, "start": record.start}
    if record.holds:
        fields["holds"] = record.holds
    return fields


def read(path: Path) -> dict[str, Record]:
    """The records in `path`; {} without the file or with one that holds none."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return {}
    return parse(data) or {}
