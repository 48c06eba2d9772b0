"""What every benchmark reports beside its figures: the CPU, and the peak memory of a process tree."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import psutil

from coordinator.serving import parse_cpuinfo


def cpu_record(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, object]:
    """The CPU model, its cores and its SIMD and bf16 flags (what a timing depends on), for a benchmark's JSON; the
    model None where /proc/cpuinfo cannot be read."""
    try:
        info = parse_cpuinfo(cpuinfo.read_text())
    except OSError:
        return {"model": None, "cores": os.cpu_count(), "flags": []}
    return {"model": info.model, "cores": os.cpu_count(), "flags": info.relevant_flags()}


def cpu_line(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`<model>, <n> cores, flags <the SIMD and bf16 flags>`: a figure is compared only with one taken on the same."""
    cpu = cpu_record(cpuinfo)
    if cpu["model"] is None:
        return f"unknown CPU, {cpu['cores']} cores"
    return f"{cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags']) or 'none'}"  # type: ignore[arg-type]


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
