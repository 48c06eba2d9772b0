"""A real Slurm of one node on this machine for the e2e tests (tests/e2e/test_slurm.py): Debian's slurm-wlm
(`apt-get install -y slurm-wlm munge`; `bash scripts/setup.sh --for-tests` installs them), run as root.

`start_cluster(directory)` writes a slurm.conf under `directory` (its own ports, state, spool, logs and pid
files: a Slurm already on this machine is left alone), starts munged when none answers, then slurmctld and
slurmd, and waits for the node to be idle. `SlurmCluster.stop()` cancels every job of this cluster, waits
for them to end, and stops the daemons it started by the pids in their pid files (munged only when it
started it). The node, `localhost`, claims 4 CPUs whatever the machine has (config_overrides), enough for
two tasks; OverSubscribe lets jobs share it. KillWait is long (KILL_WAIT_S), so that a task still running
when Slurm would SIGKILL it is told apart from one that stopped by itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port
from tests.waits import DAEMON_START_S, START_S, run_waiting, wait_until

#: seconds between Slurm's SIGTERM to a job's processes (scancel, a requeue) and its SIGKILL
KILL_WAIT_S = 120
#: the system's munged (Debian's munge package)
MUNGE_PID_FILE = Path("/run/munge/munged.pid")

CONF = """\
ClusterName=baton-e2e
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
KillWait={kill_wait}
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
NodeName=localhost CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@dataclass
class SlurmCluster:
    directory: Path
    conf: Path
    munged_pid: int | None  # the munged this cluster started, if it did

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment for a Slurm command: no Slurm job's variables (a test run inside
        a job), no RANK / NODE_RANK (the tasks' ranks must come from Slurm), this cluster's SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k not in ("RANK", "NODE_RANK")}
        return {**env, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sinfo, squeue, scancel, scontrol) on this cluster; fail if it fails."""
        out = run_waiting(list(cmd), waiting_for=f"`{' '.join(cmd)}`", timeout=START_S, env=self.env())
        if out.returncode != 0:
            pytest.fail(f"`{' '.join(cmd)}` exited {out.returncode}: {out.stderr.strip()}")
        return out

    def state(self, job: str) -> str | None:
        """The job's state as squeue shows it (PENDING, RUNNING, COMPLETING, ...); None once it has ended."""
        return self.query("squeue", "--noheader", "--jobs", job, "--format=%T") or None

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "show", "job", "--oneliner", job).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def query(self, *cmd: str) -> str | None:
        """A Slurm client command's output; None when it fails (say, slurmctld not up yet, or gone)."""
        out = run_waiting(list(cmd), waiting_for=f"`{' '.join(cmd)}`", timeout=START_S, env=self.env())
        return out.stdout.strip() if out.returncode == 0 else None

    def jobs(self) -> list[str]:
        return (self.query("squeue", "--noheader", "--format=%i") or "").split()

    def stop(self) -> None:
        """Cancel every job and wait for them to end (Slurm SIGKILLs what is left after KillWait), then
        stop the daemons this cluster started."""
        if running(read_pid(self.directory / "slurmctld.pid")):
            for job in self.jobs():
                self.query("scancel", job)
            wait_until(lambda: not self.jobs(), waiting_for="this cluster's jobs to end", timeout=KILL_WAIT_S + START_S)
        for name in ("slurmd", "slurmctld"):
            stop_daemon(name, read_pid(self.directory / f"{name}.pid"))
        if self.munged_pid is not None:
            stop_daemon("munged", self.munged_pid)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def running(pid: int | None) -> bool:
    """True while `pid` runs and is not a zombie."""
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_daemon(name: str, pid: int | None) -> None:
    """SIGTERM a daemon this test started (by the pid its pid file named) and wait for it to exit."""
    if not running(pid):
        return
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not running(pid), waiting_for=f"{name} (pid {pid}) to exit", timeout=DAEMON_START_S)


def start_daemon(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run a daemon's start command (it forks the daemon and exits); its output, and the daemon's inherited
    stdout and stderr, to `log`, so that no pipe of ours waits for the daemon."""
    with log.open("a") as out:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, timeout=DAEMON_START_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timed out after {DAEMON_START_S:.0f} s waiting for `{' '.join(cmd)}` to start its daemon")
    if rc.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)}` exited {rc.returncode}; its log {log}:\n{log.read_text()[-3000:]}")


def munge_answers() -> bool:
    return subprocess.run(["munge", "--no-input"], capture_output=True, check=False).returncode == 0


def start_munged(log: Path) -> int | None:
    """Start munged as user munge when none answers; its pid when this started it, else None."""
    if munge_answers():
        return None
    run_dir = MUNGE_PID_FILE.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    start_daemon(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], log)
    wait_until(munge_answers, waiting_for="munged to answer (munge --no-input)", timeout=DAEMON_START_S)
    return read_pid(MUNGE_PID_FILE)


def start_cluster(directory: Path) -> SlurmCluster:
    """Configure and start a one-node Slurm under `directory` (see the module's docstring)."""
    if os.geteuid() != 0:
        pytest.fail("the Slurm e2e tests start slurmctld and slurmd, which run jobs as their users: run them as root")
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: apt-get install -y slurm-wlm munge (bash scripts/setup.sh --for-tests)"
        )
    (directory / "state").mkdir(parents=True, exist_ok=True)
    (directory / "spool").mkdir(exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(CONF.format(d=directory, ctld_port=free_port(), slurmd_port=free_port(), kill_wait=KILL_WAIT_S))
    cluster = SlurmCluster(directory, conf, start_munged(directory / "munged.start.log"))
    try:
        start_daemon(["slurmctld", "-f", str(conf)], directory / "slurmctld.log", cluster.env())
        start_daemon(["slurmd", "-f", str(conf), "-N", "localhost"], directory / "slurmd.log", cluster.env())
        wait_until(
            lambda: cluster.query("sinfo", "--noheader", "--format=%t") == "idle",
            waiting_for="slurmd's node to be idle in sinfo",
            timeout=DAEMON_START_S,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster
