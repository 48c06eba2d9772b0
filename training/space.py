"""Room on the log path's filesystem for what an update writes, checked before it trains: a full disk stops
the trainer while it saves, often without a traceback (the log that would hold one is on the same disk).

    room = Room.of(paths.run_dir, weights=parameter_count(model), moments=True)
    if not room.enough: raise ...(room.describe())
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: bytes an update writes per weight: the trainer's fp32 output (4; v<N>/fp32/ hard-links it) and the served copy
#: in the base model's dtype (2 for bf16 / fp16; an fp32 model is not cast, so this over-counts it by a third)
BYTES_PER_WEIGHT = 6
#: more with Adam's moments carried to the next update (training.carry): two fp32 tensors a weight
OPTIMIZER_BYTES_PER_WEIGHT = 8
GB = 1e9


@dataclass(frozen=True)
class Room:
    folder: Path
    free: int
    need: int

    @property
    def enough(self) -> bool:
        return self.free >= self.need

    @classmethod
    def of(cls, folder: Path, weights: int, moments: bool) -> Room | None:
        """None when the filesystem does not say how much it holds (some FUSE filesystems report 0 blocks)."""
        free = free_bytes(folder)
        per_weight = BYTES_PER_WEIGHT + (OPTIMIZER_BYTES_PER_WEIGHT if moments else 0)
        return None if free is None else cls(folder, free, weights * per_weight)

    def describe(self) -> str:
        return (
            f"the filesystem of {self.folder} has {self.free / GB:.2f} GB free, and this update writes about "
            f"{self.need / GB:.2f} GB there (the trained weights in fp32, the served copy and the optimizer's moments "
            "when they carry)"
        )


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of `folder` (or of its nearest existing
    parent: the update's folder may not exist yet)."""
    path = folder
    while not path.exists() and path != path.parent:
        path = path.parent
    stats = os.statvfs(path)
    return None if stats.f_blocks == 0 else stats.f_bavail * stats.f_frsize
