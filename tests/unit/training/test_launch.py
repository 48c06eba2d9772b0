"""The training launcher stops its process group when the entry point is signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# A stand-in for the entry point: the real signal setup and run_group around a
# group of sleeps (what matters is the launcher's handling, not what it runs).
CHILD = """
import sys
from pathlib import Path
from training.launch import exit_on_sigterm, run_group
exit_on_sigterm()
log = Path(sys.argv[1])
run_group(["bash", "-c", "sleep 300 & sleep 300 & wait"], log, {"PATH": "/usr/bin:/bin"}, 600, 5)
"""


def _group_alive(pgid: int) -> bool:
    out = subprocess.run(["ps", "-e", "-o", "pgid=,stat="], capture_output=True, text=True, check=True).stdout
    return any(int(f[0]) == pgid and not f[1].startswith("Z") for f in (line.split() for line in out.splitlines()))


def _wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text().strip()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, None)])
def test_a_signalled_launcher_stops_its_training_group(tmp_path: Path, sig: signal.Signals, code: int | None) -> None:
    log = tmp_path / "train.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(log)], env=env, stderr=subprocess.PIPE, text=True)
    pgid = int(_wait_for(tmp_path / "train.log.pgid"))
    time.sleep(0.3)
    assert _group_alive(pgid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    survived = _group_alive(pgid)
    if survived:  # the group this test started, by the id it recorded
        os.killpg(pgid, signal.SIGKILL)
    if code is not None:
        assert proc.returncode == code, err
    else:  # KeyboardInterrupt: Python ends by the signal itself
        assert proc.returncode != 0
    assert not survived, "the training group outlived the launcher"
    assert not (tmp_path / "train.log.pgid").exists()
