"""The shared-filesystem harness itself (bench/sharedfs.py), on each served profile: two nodes, each through
its own client in its own mount namespace, see each other's files; the files are on the server's store, not on
the local disk under the mount point; and nothing of the server or the clients outlives it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from bench.sharedfs import shared_fs
from tests.e2e.nodes import kill_the_nodes_left, start_node

pytestmark = pytest.mark.e2e

#: node 0 writes a file by temp + rename and waits for node 1's answer; node 1 waits for the file by name, checks
#: its mount is its own client's, answers. Each line it prints is checked below.
SCRIPT = r"""
set -u
dir=$1 rank=$2
grep -E " $dir fuse\.(glusterfs|sshfs) " /proc/self/mounts | sed 's/^/mount: /'
if [ "$rank" = 0 ]; then
  printf 'from node0\n' >"$dir/.a.tmp" && mv "$dir/.a.tmp" "$dir/a"
  for _ in $(seq 600); do [ -e "$dir/b" ] && break; sleep 0.1; done
  echo "read: $(cat "$dir/b")"
else
  for _ in $(seq 600); do [ -e "$dir/a" ] && break; sleep 0.1; done
  echo "read: $(cat "$dir/a")"
  printf 'from node1\n' >"$dir/.b.tmp" && mv "$dir/.b.tmp" "$dir/b"
fi
"""


@pytest.fixture(autouse=True)
def no_node_outlives_its_test():
    yield
    kill_the_nodes_left()


@pytest.mark.parametrize("profile", ["gluster", "gluster-5s", "sshfs"])
def test_two_nodes_share_files_through_their_own_clients(profile: str, tmp_path: Path) -> None:
    script = tmp_path / "node.sh"
    script.write_text(SCRIPT)
    with shared_fs(tmp_path, profile) as fs:
        assert os.path.ismount(fs.path)
        nodes = [start_node(rank, [str(fs.path), str(rank)], fs=fs, script=script) for rank in (0, 1)]
        outputs = [proc.communicate(timeout=120)[0] for proc in nodes]
        for rank, (proc, out) in enumerate(zip(nodes, outputs, strict=True)):
            assert proc.returncode == 0, f"node {rank} exited {proc.returncode}:\n{out}"
            source = f"root@127.0.0.1:{fs.store}" if profile == "sshfs" else "10.77.0.1:gv0"
            assert f"mount: {source} {fs.path} " in out, out
        assert "read: from node1" in outputs[0] and "read: from node0" in outputs[1], outputs
        assert (fs.store / "a").read_text() == "from node0\n" and (fs.store / "b").read_text() == "from node1\n"
        assert (fs.path / "a").read_text() == "from node0\n"  # this test's own client sees them too
        servers = [proc.pid for proc in fs._procs]
    assert not os.path.ismount(fs.path) and list(fs.path.iterdir()) == []  # nothing was written to the local disk
    left = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, servers))], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"server or client processes left: {left.stdout}"


#: what each profile must show (bench/sharedfs.py; ../shared/FACTS.md measured the same): sshfs lists a
#: folder 20 s late and keeps a deleted name 21 s, and shares no lock between clients; GlusterFS shares locks
SHOWN = {
    "gluster": ["locks shared with rank 0:          yes"],
    "gluster-5s": ["locks shared with rank 0:          yes"],
    "sshfs": [
        "a new file, in a listing:          not within 8 s",
        "a deleted file, still there for:   not within 8 s",
        "locks shared with rank 0:          no (each node locks alone)",
    ],
}


@pytest.mark.parametrize("profile", ["gluster", "gluster-5s", "sshfs"])
def test_check_shared_fs_measures_each_profile_on_every_node(profile: str, tmp_path: Path) -> None:
    with shared_fs(tmp_path, profile) as fs:
        log = fs.path / "exp"
        args = ["--check-shared-fs", "--log-path", str(log), "--num-nodes", "2"]
        nodes = [start_node(0, [*args, "--master"], fs=fs), start_node(1, [*args, "--worker", "1"], fs=fs)]
        outs = [proc.communicate(timeout=180)[0] for proc in nodes]
        assert [proc.returncode for proc in nodes] == [0, 0], outs
        for out in outs:  # every node prints rank 0's findings
            assert "rank 1 (node1) sees rank 0's writes:" in out, out
            for line in SHOWN[profile]:
                assert line in out, out
            assert f"[baton] {log} is fit for a multi-node run at BATON_DEAD_AFTER_S=10" in out, out
        (check,) = [p for p in (fs.store / "exp" / "fscheck").iterdir() if p.is_dir()]
        findings = json.loads((check / "findings.json").read_text())
        assert [pair["rank"] for pair in findings["pairs"]] == [1] and findings["pairs"][0]["host"] == "node1"


def test_check_shared_fs_refuses_a_dead_after_no_longer_than_two_heartbeats_and_the_staleness(tmp_path: Path) -> None:
    """Heartbeats every 1 s, a rank dead after 2 s: two beats and any staleness reach it (exit 2, naming the
    setting and what to set)."""
    with shared_fs(tmp_path, "gluster") as fs:
        args = ["--check-shared-fs", "--log-path", str(fs.path / "exp"), "--num-nodes", "2"]
        env = {"BATON_HEARTBEAT_S": "1", "BATON_DEAD_AFTER_S": "2"}
        nodes = [start_node(0, [*args, "--master"], env, fs=fs), start_node(1, [*args, "--worker", "1"], env, fs=fs)]
        outs = [proc.communicate(timeout=180)[0] for proc in nodes]
    assert [proc.returncode for proc in nodes] == [2, 2], outs
    (check,) = [p for p in (fs.store / "exp" / "fscheck").iterdir() if p.is_dir()]
    (pair,) = json.loads((check / "findings.json").read_text())["pairs"]
    least = math.floor(2 * 1 + pair["old_content_s"]) + 1  # the advice: above two beats and what was measured
    for out in outs:
        assert "[baton] error: BATON_DEAD_AFTER_S=2 is too short here: another node saw a rewritten file's old" in out
        assert f"Set BATON_DEAD_AFTER_S to {least} or more" in out and "actimeo=1" in out, out
