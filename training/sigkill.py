"""A training process killed by SIGKILL, and what that usually is: a fresh training (training/update.py) and the
warm trainer's driver side (coordinator/driver/trainer.py) name it in the same words. Light: the driver imports it."""

from __future__ import annotations

import re

#: what a SIGKILL nobody of ours sent usually is
HINT = (
    "a training process was killed by SIGKILL: when nobody sent it, the kernel's OOM killer did, because memory "
    "ran out (check `dmesg | grep -i oom`); lower algorithm.per_device_train_batch_size or algorithm.cutoff_len, "
    "or use a DeepSpeed preset that offloads"
)

_EXITCODE = re.compile(r"exitcode\s*:\s*-9\b")


def reported(text: str) -> bool:
    """A log's text reports a worker's SIGKILL: torchrun's `Signal 9 (SIGKILL)` / `exitcode  : -9`, or the warm
    trainer's "the worker exited: Signal 9 (SIGKILL)"."""
    return "Signal 9 (SIGKILL)" in text or _EXITCODE.search(text) is not None
