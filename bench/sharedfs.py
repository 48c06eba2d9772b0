"""A real shared filesystem for the multi-node tests and benchmarks: a volume served on this machine, mounted by
every node through a client of its own, at the same path (docs/multinode.md "Filesystems").

    with shared_fs(tmp_path, "gluster-5s") as fs:          # the server, and this process's own client at fs.path
        start_node(0, [..., "--log-path", str(fs.path / "log")], fs=fs)   # tests/e2e/nodes.py, bench/nodes.py

Profiles (`PROFILES`):
- `local`: no server; fs.path is a folder of the local disk that every node sees at once.
- `gluster`: GlusterFS 10 with its clients' defaults (1 s attribute and entry caches).
- `gluster-5s`: the same volume with NFS-like client caches: 5 s entry, attribute and negative timeouts (a new
  name is 5 s late by name).
- `sshfs`: an sshfs export through a private sshd on loopback: no lock is shared between clients and a listing
  or an mtime is cached for 20 s.

GlusterFS refuses bricks on loopback addresses, so its server (glusterd and the brick) runs in a network, mount
and PID namespace of its own (`unshare --net --mount --pid`), on 10.77.0.1 of that namespace's loopback, with
its state folders bind-mounted from the test's folder: nothing of it is seen outside, and SIGKILL of the
namespace's first process stops all of it. Each client (this test's, and one per node, started by the node's
first process inside the node's own mount namespace) enters that network namespace alone (`nsenter --net`),
through a handle bind-mounted in the test's folder; the node's other processes stay on this machine's network.
The sshd listens on 127.0.0.1 only. Recipe and measurements: ../shared/FACTS.md.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = ("local", "gluster", "gluster-5s", "sshfs")
#: how long a server or a client may take to come up here (measured 2-3 s; a loaded 2-core machine)
START_S = 60
#: the GlusterFS server's address, on the loopback of its own network namespace
ADDRESS = "10.77.0.1"
#: client options per profile
GLUSTER_OPTIONS = {"gluster": [], "gluster-5s": ["--entry-timeout=5", "--attribute-timeout=5", "--negative-timeout=5"]}

GLUSTER_SERVER = r"""
set -e
state=$0
ip link set lo up
ip addr add {address}/32 dev lo
# glusterd's command socket is /run/glusterd.socket: a /run of its own, so that two servers never share it
mount -t tmpfs tmpfs /run
for dir in /var/lib/glusterd /run/gluster /var/log/glusterfs; do
  mkdir -p "$dir" "$state/$(basename "$dir")"
  mount --bind "$state/$(basename "$dir")" "$dir"
done
/usr/sbin/glusterd -p "$state/glusterd.pid"
for _ in $(seq 300); do gluster --mode=script volume info >/dev/null 2>&1 && break; sleep 0.1; done
gluster --mode=script volume create gv0 {address}:"$state/brick" force >/dev/null
gluster --mode=script volume start gv0 >/dev/null
touch "$state/ready"
exec sleep infinity
"""


@dataclass
class SharedFs:
    """A started profile: `path`, mounted here by this test's own client; `node_mount`, the shell commands a
    node's first process runs to mount its own client at `path` (and leave its pid in $BATON_FS_CLIENT)."""

    profile: str
    path: Path
    state: Path
    node_mount: str = ""
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _handles: list[Path] = field(default_factory=list)

    def gluster(self, *args: str) -> str:
        """The `gluster` command line's output inside the server's namespaces (a GlusterFS profile only)."""
        unshare = self._procs[0].pid
        # its child, the server's first process: in the server's PID namespace too (the CLI needs its /proc)
        server = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()[0]
        cmd = ["nsenter", f"--target={server}", "--net", "--mount", "--pid", "gluster", "--mode=script", *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    @property
    def store(self) -> Path:
        """Where the server keeps the files (the brick or the export): what every client should see."""
        return {"local": self.path, "sshfs": self.state / "export"}.get(self.profile, self.state / "brick")


@contextlib.contextmanager
def shared_fs(root: Path, profile: str) -> Iterator[SharedFs]:
    """Serve `profile` under `root` (a test's own folder) and mount this test's client at root/shared."""
    if profile not in PROFILES:
        raise ValueError(f"unknown shared-filesystem profile {profile!r}; one of {PROFILES}")
    state = root / "fs-state"
    state.mkdir(parents=True)
    fs = SharedFs(profile, root / "shared", state)
    fs.path.mkdir()
    try:
        if profile.startswith("gluster"):
            _serve_gluster(fs)
        elif profile == "sshfs":
            _serve_sshfs(fs)
        if fs.node_mount:
            fs._procs.append(_mount_here(fs))
        yield fs
    finally:
        _stop(fs)


def _serve_gluster(fs: SharedFs) -> None:
    script = GLUSTER_SERVER.format(address=ADDRESS)
    server = subprocess.Popen(
        [
            "unshare",
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "bash",
            "-c",
            script,
            str(fs.state),
        ],
        stdout=(fs.state / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    fs._procs.append(server)
    _wait(lambda: (fs.state / "ready").exists(), "the GlusterFS volume to start", server, fs.state / "server.log")
    # unshare itself is in the new network namespace (it forks only for the PID namespace): a handle on it that a
    # node's client can enter from inside the node's own PID namespace, where this pid is not seen
    handle = fs.state / "netns"
    handle.touch()
    subprocess.run(["mount", "--bind", f"/proc/{server.pid}/ns/net", str(handle)], check=True)
    fs._handles.append(handle)
    options = " ".join(GLUSTER_OPTIONS[fs.profile])
    fs.node_mount = (
        f"nsenter --net={shlex.quote(str(handle))} /usr/sbin/glusterfs -N --volfile-server={ADDRESS} "
        f"--volfile-id=gv0 {options} --log-file={shlex.quote(str(fs.state))}/client-$(hostname).log "
        f"{shlex.quote(str(fs.path))}"
    )


def _serve_sshfs(fs: SharedFs) -> None:
    (fs.state / "export").mkdir()
    key = fs.state / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(fs.state / "host_key")], check=True)
    (fs.state / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    port = _free_port()
    (fs.state / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {fs.state / 'host_key'}\nPidFile {fs.state / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {fs.state / 'authorized_keys'}\nPermitRootLogin prohibit-password\nStrictModes no\n"
        "PasswordAuthentication no\nUsePAM no\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder (Debian's path)
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(fs.state / "sshd_config")],
        stdout=(fs.state / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    fs._procs.append(sshd)
    _wait(lambda: _listens(port), f"sshd on 127.0.0.1:{port}", sshd, fs.state / "server.log")
    options = f"port={port},IdentityFile={key},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR"
    fs.node_mount = (
        f"sshfs -f -o {shlex.quote(options)} root@127.0.0.1:{shlex.quote(str(fs.state / 'export'))} "
        f"{shlex.quote(str(fs.path))} 2>>{shlex.quote(str(fs.state))}/client-$(hostname).log"
    )


def node_init(fs: SharedFs | None) -> str:
    """The lines a node's first process runs before run.sh: its own client at fs.path, in its own mount namespace
    (the copy of this test's mount is detached first), its pid in BATON_FS_CLIENT; nothing for `local`."""
    if fs is None or not fs.node_mount:
        return ""
    path = shlex.quote(str(fs.path))
    return (
        f"umount -l {path} 2>/dev/null\n"
        f"{fs.node_mount} &\nBATON_FS_CLIENT=$!\n"
        f"for _ in $(seq {START_S * 10}); do mountpoint -q {path} && break; sleep 0.1; done\n"
        f'mountpoint -q {path} || {{ echo "[node $0] its shared-filesystem client did not mount {path}"; exit 98; }}\n'
    )


def _mount_here(fs: SharedFs) -> subprocess.Popen:
    """This test's own client, in this process's mount namespace: what the test reads is what a node reads."""
    client = subprocess.Popen(["bash", "-c", fs.node_mount.replace("$(hostname)", "test")], start_new_session=True)
    _wait(lambda: os.path.ismount(fs.path), f"this test's client to mount {fs.path}", client, None)
    return client


def _stop(fs: SharedFs) -> None:
    """Unmount this test's client, stop the server (the whole namespace), drop the handles: nothing is left."""
    if os.path.ismount(fs.path):
        subprocess.run(["umount", "-l", str(fs.path)], check=False)
    for proc in reversed(fs._procs):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    for handle in fs._handles:
        subprocess.run(["umount", str(handle)], check=False)


def _wait(ready, what: str, proc: subprocess.Popen, log: Path | None) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            said = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"waited {START_S} s for {what} (exit {proc.poll()}): {said}")
        time.sleep(0.1)


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
