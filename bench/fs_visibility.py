"""How soon one node sees another's new file on each shared-filesystem profile, looking by name, by listing,
or both ways (Baton's readers: coordinator.cluster.scan_ranks), and whether it can then read it; and (`rewrite`)
how soon it reads a file another node rewrites in place (rollout_engine.files.overwrite_text: heartbeats and
status files), and how many of its reads caught a write half done.

    python -m bench.fs_visibility --profiles gluster-5s sshfs      # as root; ~3 min a profile

Two "nodes" (PID, UTS and mount namespaces of their own, each with its own client: bench/sharedfs.py); the
writer creates 5 files (temp + rename) 4 s apart, the reader polls every 10 ms by one way, from before each
file exists (a client may cache the absence). Prints, per way, the delay until seen and until read (s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.sharedfs import PROFILES, node_init, shared_fs

FILES = 5
WAYS = ["name", "listing", "both", "rewrite"]


def writer(folder: str, way: str) -> None:
    if way == "rewrite":
        return rewriter(folder)
    time.sleep(3)
    for i in range(FILES):
        time.sleep(4)
        tmp = os.path.join(folder, f".f{i}.tmp")
        with open(tmp, "w") as handle:
            handle.write(repr(time.time()))
        os.rename(tmp, os.path.join(folder, f"f{i}"))


def rewriter(folder: str) -> None:
    """A heartbeat's writer: the file made once, then rewritten in place every 4 s (padded to a changing length,
    so that a reader can catch a mix)."""
    from rollout_engine.files import overwrite_text

    path = os.path.join(folder, "beat")
    overwrite_text(path, json.dumps({"i": -1, "t": time.time()}))
    time.sleep(3)
    for i in range(FILES):
        time.sleep(4)
        overwrite_text(path, json.dumps({"i": i, "t": time.time(), "pad": "x" * (200 * (i % 2) + 3000)}))


def rereader(folder: str) -> None:
    path = os.path.join(folder, "beat")
    found, torn, reads = [], 0, 0
    for i in range(FILES):
        while True:
            reads += 1
            try:
                with open(path) as handle:
                    got = json.loads(handle.read())
            except FileNotFoundError:
                got = {"i": -2}
            except ValueError:
                torn += 1
                got = {"i": -2}
            if got["i"] >= i:
                break
            time.sleep(0.01)
        found.append({"seen_s": round(time.time() - got["t"], 3), "read_s": round(time.time() - got["t"], 3)})
    print("RESULT " + json.dumps(found), flush=True)
    print(f"TORN {torn} {reads}", flush=True)


def reader(folder: str, way: str) -> None:
    if way == "rewrite":
        return rereader(folder)
    found = []
    for i in range(FILES):
        name = f"f{i}"
        path = os.path.join(folder, name)
        while True:
            by_name = way in ("name", "both") and os.path.exists(path)
            by_listing = way in ("listing", "both") and name in os.listdir(folder)
            if by_name or by_listing:
                break
            time.sleep(0.01)
        seen = time.time()
        while True:
            try:
                with open(path) as handle:
                    written = float(handle.read())
                break
            except (FileNotFoundError, ValueError):
                time.sleep(0.01)
        found.append({"seen_s": round(seen - written, 3), "read_s": round(time.time() - written, 3)})
    print("RESULT " + json.dumps(found), flush=True)


def node(fs, name: str, *args: str) -> subprocess.Popen:
    mount = node_init(fs).replace("$0", name)
    script = f"hostname {name}\n{mount}\nexec {sys.executable} -m bench.fs_visibility {' '.join(args)}\n"
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "bash", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["gluster", "gluster-5s", "sshfs"], choices=PROFILES[1:])
    parser.add_argument("--ways", nargs="+", default=WAYS, choices=WAYS)
    parser.add_argument("--role", choices=["writer", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--way", default="both", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "writer":
        return writer(args.folder, args.way)
    if args.role == "reader":
        return reader(args.folder, args.way)
    for profile in args.profiles:
        for way in args.ways:
            with shared_fs(Path(tempfile.mkdtemp()), profile) as fs:
                folder = str(fs.path)
                w = node(fs, "writer", "--role", "writer", "--folder", folder, "--way", way)
                r = node(fs, "reader", "--role", "reader", "--folder", folder, "--way", way)
                out = r.communicate(timeout=300)[0]
                w.wait(timeout=60)
            rows = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
            seen = [row["seen_s"] for row in rows[0]] if rows else []
            read = [row["read_s"] for row in rows[0]] if rows else []
            torn = next((line.split()[1:] for line in out.splitlines() if line.startswith("TORN ")), None)
            mixes = f", {torn[0]} of {torn[1]} reads caught a write half done" if torn else ""
            print(f"{profile:11} by {way:8} seen after {seen} s, read after {read} s{mixes}", flush=True)


if __name__ == "__main__":
    main()
