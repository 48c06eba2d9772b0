"""What every benchmark reports beside its figures: the CPU, and the peak memory of a process tree."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import psutil


def cpu_line() -> str:
    model, flags = "?", []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            wanted = ("avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma", "f16c")
            flags = [f for f in line.split(":", 1)[1].split() if f in wanted]
    return f"{model}, {os.cpu_count()} cores, flags {' '.join(flags)}"


class PeakRss:
    """The largest sum of RSS over a process and its descendants, sampled every `every_s` in a thread."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.peak, self.every_s, self.root = 0, every_s, psutil.Process(pid)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.done.is_set():
            total = 0
            with contextlib.suppress(psutil.Error):
                for proc in [self.root, *self.root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            self.done.wait(self.every_s)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak
