"""Read the history rows of W&B offline runs back: the `.wandb` file each run directory holds.

wandb 0.31 no longer ships its Python reader of that file (`wandb.sdk.internal.datastore`), so this is
its framing (a LevelDB-style log: a 7-byte `:W&B` header, 32 KiB blocks, records of crc32, length,
type) around wandb's own protobuf `Record`, parsed with `wandb.proto.wandb_internal_pb2`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
#: record types: a whole record, or its first, middle and last piece
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    """The protobuf records of one `.wandb` file."""
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    pos, found, pieces = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            found.append(pieces)
    return found


def history(run_dir: Path) -> tuple[str, list[dict]]:
    """(run id, history rows: {key: value, "_step": n}) of one offline run directory."""
    from wandb.proto import wandb_internal_pb2

    run_id, rows = "", []
    for raw in records(next(run_dir.glob("run-*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return run_id, rows
