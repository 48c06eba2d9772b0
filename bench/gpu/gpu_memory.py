"""Sample every GPU process's memory (NVML) until killed; one line per sample and process.

usage: python gpu_memory.py OUT.tsv   (columns: time, pid, MiB, the process's command line)
Each line names its process so that concurrent cases can be told apart afterwards.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:400]
    except OSError:
        return "?"


def main(out: Path) -> None:
    import pynvml  # nvidia-ml-py, on GPU machines only

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with out.open("a", buffering=1) as fh:
        while True:
            now = time.time()
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                mib = (proc.usedGpuMemory or 0) / 2**20
                fh.write(f"{now:.1f}\t{proc.pid}\t{mib:.0f}\t{cmdline(proc.pid)}\n")
            time.sleep(0.25)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
