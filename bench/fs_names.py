"""The names (creates, renames, folders) each node makes on the log path: at its start, and in an iteration.

    PYTHONPATH=. python -m bench.fs_names [--window start|iteration] [--data-path D] [--json out.json]

Two real `scripts/run.sh` nodes (bench/nodes.py: namespaces of their own, a vLLM each) share a log path on
the local disk, `--rl-phase both --eval-interval 1`, each under `strace -f` (openat/creat with O_CREAT,
rename*, mkdir*, link*: the calls that can make a name). Once both have started iteration 2's train rollout
(or, `--window start`, iteration 1's), `run.sh --stop` ends them, and each node's trace is counted:

- start: from the node's first call to its first rollout's start (its log, and its group's record where the
  layout makes one), inclusive;
- iteration: from iteration 1's train rollout log to iteration 2's, exclusive.

A create is an open with O_EXCL that succeeded, or the first open with O_CREAT of a path (a log opened to append
again makes no name); every successful rename and mkdir counts. On a metadata server (Lustre's MDS, a GlusterFS
brick) these are the costly operations that issue 44's goal caps at N/5 a second over the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.nodes import node_command
from bench.server import free_port
from rollout_engine.layout import iteration_name

REPO = Path(__file__).resolve().parents[1]
TRACED = "openat,open,creat,rename,renameat,renameat2,mkdir,mkdirat,link,linkat,symlink"
WRAPPER = 'exec strace -f -qq --seccomp-bpf -o "$BATON_NAMES_TRACE" -e trace={traced} bash {run_sh} "$@"\n'
SETTINGS = ["policy_config.max_new_tokens=32", "env_config.max_vllm_sessions=8", "env_config.live_view=plain"]


def calls(trace: Path) -> list[str]:
    """The trace's calls, each on one line (strace -f splits a call that another process interrupts)."""
    pending: dict[str, str] = {}
    out = []
    for line in trace.read_text().splitlines():
        pid = line.split(None, 1)[0] if line else ""
        if line.endswith("<unfinished ...>"):
            pending[pid] = line.removesuffix("<unfinished ...>").rstrip()
            continue
        resumed = re.search(r"<\.\.\. \w+ resumed>", line)
        out.append(pending.pop(pid, "") + line[resumed.end() :] if resumed else line)
    return out


def names(trace: Path, log: str, window: str) -> tuple[Counter, list[str]]:
    """(counts by kind C/R/D, the names made) in the window of one node's trace."""
    first = re.compile(
        rf"{iteration_name(1)}\.(train|test)\.log$" if window == "start" else rf"{iteration_name(1)}\.train\.log$"
    )
    last = re.compile(rf"{iteration_name(2)}\.train\.log$")
    kinds: Counter = Counter()
    made: list[str] = []
    seen: set[str] = set()
    inside, started = window == "start", False
    for line in calls(trace):
        if "= -1" in line or log not in line:
            continue
        paths = re.findall(r'"([^"]*)"', line)
        kind = ""
        if re.search(r"\b(open|openat|creat)\(", line) and "O_CREAT" in line:
            path = paths[0]
            if window == "start" and started:  # the first rollout's group record right after its log, if any
                if re.search(r"rollout-t\w+\.pgid$", path):
                    kinds["C"] += 1
                    made.append(f"C {path}")
                break
            if window == "iteration" and last.search(path):
                break
            if first.search(path):
                inside = True
                started = window == "start"
            kind = "C" if ("O_EXCL" in line or path not in seen) else ""
            seen.add(path)
        elif started:
            continue
        elif re.search(r"\brename", line):
            kind, path = "R", paths[-1]
        elif re.search(r"\bmkdir", line):
            kind, path = "D", paths[0]
        if inside and kind:
            kinds[kind] += 1
            made.append(f"{kind} {path}")
    return kinds, made


def marked(trace: Path, pattern: str) -> bool:
    try:
        return any(pattern in line and "O_CREAT" in line for line in trace.read_text().splitlines())
    except OSError:
        return False


def run(data: Path, work: Path, window: str, wait_s: float) -> dict[str, dict]:
    """Two nodes to the window's end, stopped; each node's counts."""
    log = work / "log"
    wrapper = work / "strace_run.sh"
    wrapper.write_text(WRAPPER.format(traced=TRACED, run_sh=REPO / "scripts/run.sh"))
    iterations = 1 if window == "start" else 2
    common = ["--data-path", str(data), "--log-path", str(log), "--num-nodes", "2", "--rank-weights", "1,1"]
    common += ["--rl-phase", "both", "--max-iterations", str(iterations), "--eval-interval", "1", *SETTINGS]
    mark = f"{iteration_name(iterations)}.train.log"
    procs = []
    for rank in (0, 1):
        cmd, env = node_command(rank, wrapper, [*common, *(["--master"] if rank == 0 else ["--worker", "1"])])
        env |= {"BATON_VLLM_PORT": str(free_port()), "BATON_NAMES_TRACE": str(work / f"trace.{rank}")}
        with open(work / f"node{rank}.out", "w") as out:  # the node keeps its own descriptor
            procs.append(
                subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + wait_s
    while not all(marked(work / f"trace.{r}", mark) for r in (0, 1)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            print(f"[fs_names] the nodes did not both start {mark} (see {work}/node*.out)", file=sys.stderr)
            break
        print(f"[fs_names] waiting for both nodes to start {mark}", file=sys.stderr, flush=True)
        time.sleep(10)
    subprocess.run(["bash", str(REPO / "scripts/run.sh"), "--stop", "--log-path", str(log)], check=False)
    for proc in procs:
        proc.wait(timeout=300)
    report = {}
    for rank, role in ((0, "master"), (1, "worker")):
        kinds, made = names(work / f"trace.{rank}", str(log), window)
        report[role] = {
            "creates": kinds["C"],
            "renames": kinds["R"],
            "folders": kinds["D"],
            "names": sum(kinds.values()),
            "made": sorted(re.sub(r"\.[0-9a-f]{8}\.tmp$", ".<tmp>", m.replace(str(log), "L")) for m in made),
        }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", choices=["start", "iteration"], default="start")
    parser.add_argument("--data-path", type=Path, default=Path.home() / ".cache/baton/test-data")
    parser.add_argument("--wait", type=float, default=1500, help="seconds to wait for the window's end")
    parser.add_argument("--json", type=Path, help="write the counts and the names here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fs-names-") as tmp:
        report = run(args.data_path.resolve(), Path(tmp), args.window, args.wait)
    print(f"names made on the log path, window: {args.window}")
    print("| node | creates | renames | folders | names |\n|---|---|---|---|---|")
    for role, r in report.items():
        print(f"| {role} | {r['creates']} | {r['renames']} | {r['folders']} | {r['names']} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
