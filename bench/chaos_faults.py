"""The faults of bench/chaos.py that need the kernel's help: an OOM kill and a full disk.

- `MemoryJail`: a memory cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max`) under the harness's own,
  with a limit far below what a training needs; the training's processes are moved into it, their next
  allocations go past the limit, and the kernel's OOM killer kills one of them: a real OOM kill, counted
  by the cgroup (`oom_kill` in `memory.oom_control` or `memory.events`).
- `SmallDisk`: a size-limited tmpfs mounted on the log path, and a filler file that takes all its free
  space at the moment of the fault (writes then fail with ENOSPC); removing the filler is the user freeing
  space.

Both need root (CI and this workplace's machines run as root); `available()` says why not otherwise.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


class MemoryJail:
    """A memory cgroup with a small limit; `jail(pids)` moves processes in, `oom_kills()` counts the kills."""

    def __init__(self, name: str, limit_bytes: int = 64 << 20):
        self.limit_bytes = limit_bytes
        own = next(
            (line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines() if _is_memory(line)),
            None,
        )
        if own is None:
            raise OSError("no memory cgroup in /proc/self/cgroup")
        self.v2 = not (CGROUP / "memory").is_dir()
        base = CGROUP if self.v2 else CGROUP / "memory"
        self.path = base / own.lstrip("/") / name

    def __enter__(self) -> MemoryJail:
        self.path.mkdir()
        limit = "memory.max" if self.v2 else "memory.limit_in_bytes"
        (self.path / limit).write_text(str(self.limit_bytes))
        if not self.v2:  # no swap to escape to (where the kernel has memsw accounting)
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(self.limit_bytes))
        return self

    def jail(self, pids: list[int]) -> int:
        """Move `pids` in (one write each: v1 and v2 take one pid a write); how many moved."""
        moved = 0
        for pid in pids:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
                moved += 1
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # gone meanwhile: fine
                    raise
        return moved

    def oom_kills(self) -> int:
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def wait_oom(self, timeout: float) -> int:
        """Wait until the kernel has OOM-killed in the jail (or `timeout`); the kills counted."""
        deadline = time.monotonic() + timeout
        while self.oom_kills() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.oom_kills()

    def __exit__(self, *exc: object) -> None:
        """Remove the cgroup once its processes are gone (the run stops them); a cgroup still in use stays."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.5)


def _is_memory(line: str) -> bool:
    """A /proc/self/cgroup line of the memory hierarchy (v1 `N:memory:/x`, or v2's `0::/x`)."""
    _, controllers, _ = line.split(":", 2)
    return "memory" in controllers.split(",") or (controllers == "" and not (CGROUP / "memory").is_dir())


def processes_of_groups(pgids: list[int]) -> list[int]:
    """Every pid whose process group is one of `pgids` (the training's recorded groups)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid="], capture_output=True, text=True, check=True).stdout
    wanted = set(pgids)
    return [int(pid) for pid, pgid in (line.split() for line in out.splitlines()) if int(pgid) in wanted]


class SmallDisk:
    """A tmpfs of `size_mb` on `path` (made empty); `fill()` takes its free space, `free()` gives it back."""

    def __init__(self, path: Path, size_mb: int):
        self.path, self.size_mb = path, size_mb
        self.filler = path / ".chaos-filler"

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "baton-chaos", str(self.path)],
            check=True,
            capture_output=True,
            text=True,
        )
        return self

    def fill(self) -> int:
        """Take every free byte (a file as large as the free space; then top up byte by byte to ENOSPC)."""
        stat = os.statvfs(self.path)
        size = stat.f_bavail * stat.f_frsize
        with open(self.filler, "ab", buffering=0) as out:
            try:
                os.posix_fallocate(out.fileno(), 0, size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            try:
                while True:
                    out.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return self.filler.stat().st_size

    def full(self) -> bool:
        return self.filler.exists()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "--lazy", str(self.path)], check=False, capture_output=True)


def available(fault: str) -> str | None:
    """Why `fault` ("oom" or "disk") cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return f"the {fault} fault needs root (a memory cgroup, a tmpfs mount)"
    if fault == "oom":
        try:
            jail = MemoryJail(f"baton-chaos-probe-{os.getpid()}")
            with jail:
                pass
        except OSError as exc:
            return f"cannot make a memory cgroup here: {exc}"
    return None
