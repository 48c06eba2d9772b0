"""Multi-node e2e "nodes" on one machine (bench/nodes.py): each `run.sh` runs in PID, UTS and mount namespaces
of its own (`unshare --pid --fork --mount-proc --uts`): its own host name (node0, node1, ...), its own address
(127.0.0.2, 127.0.0.3, ...: BATON_NODE_ADDR), its own vLLM port, and it cannot see the other nodes'
processes, as on real machines. The log path is shared: on the local disk, or (`fs`, bench/sharedfs.py)
through the node's own client of a filesystem the test serves, mounted in the node's mount namespace.

A node's first process (pid 1 of its namespace, bench/nodes.py NODE_INIT) sets the host name, mounts its
client (with `fs`), runs run.sh, unmounts and stops its client, and when run.sh has exited lists what is
still running in the namespace: a node that leaves a process behind exits 99 naming it (the kernel would
kill them with pid 1, hiding the leak). Signals go to run.sh itself (bench/nodes.py `signal_run_sh`);
SIGKILL of pid 1 kills the whole node at once (`kill_node`); `signal_group` reaches a group the node
recorded. Here: the tests' liveness, their start of a node and the clean-up of the nodes a failed test left.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from bench.nodes import kill_node, node_command, node_cores
from bench.sharedfs import SharedFs
from tests.conftest import REPO, default_sigint
from tests.e2e.conftest import free_port

#: heartbeats every second, a rank silent for 10 s is dead (defaults: 5 s and 30 s)
FAST_LIVENESS = {"BATON_HEARTBEAT_S": "1", "BATON_DEAD_AFTER_S": "10"}
#: the nodes started (kill_the_nodes_left)
STARTED: list[subprocess.Popen] = []


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
    cmd, extra = node_command(rank, script or REPO / "scripts/run.sh", args, fs, host)
    extra |= {"BATON_VLLM_PORT": str(free_port()), **FAST_LIVENESS}
    extra |= {"VLLM_CPU_OMP_THREADS_BIND": node_cores(rank), **(env or {})}
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
