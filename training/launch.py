"""Run `llamafactory-cli train <yaml>` under torchrun, in a tracked process group (a recipe with Baton's own keys,
the carried optimizer state or the grpo loss: torchrun on training.trainer_run, as that command would start
LLaMA-Factory's launcher).

    with hidden_gpus() as device:   # this process never initialises CUDA; the trainer gets the GPUs
        result = run_training(recipe_path, log_file, launch_cfg, device)

The command runs in its own session (its process group id is its pid; that
group and those of torchrun's workers, which start sessions of their own, are
listed in `<log_file>.pgid` while it runs, one "pgid leader_start_time" a
line) with FORCE_TORCHRUN=1, NPROC_PER_NODE (the local GPUs, 1 on CPU, unless
configured), and NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT; with `launch.node_addr`,
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name the interface that holds it (unless set). The
train environment's bin/ goes first on PATH so that `torchrun` resolves. After `timeout_s` the
groups get SIGTERM, after `grace_s` more SIGKILL; on any exception here (Ctrl-C included) they are stopped the
same way (training/groups.py). Output goes to `log_file`. `exit_on_signals()` turns SIGTERM and
SIGINT into that same path (the entry point installs it), so `kill <pid>` stops
the training groups too.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from rollout_engine.errors import ConfigError
from rollout_engine.exits import signal_exit
from rollout_engine.files import save_text
from training.config import LaunchConfig
from training.groups import (
    Group,
    become_subreaper,
    descendant_groups,
    groups_alive,
    leader_group,
    reap_adopted,
    stop_groups,
)
from training.recipe import BATON_KEYS, REPO, Device

log = logging.getLogger(__name__)
_POLL_S = 1.0
VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass
class TrainResult:
    """How the training process ended."""

    returncode: int
    timed_out: bool
    wall_s: float


def detect_device() -> Device:
    """Local GPUs via torch (imported here: the train environment has it). `device_count` asks NVML and
    initialises no CUDA; `is_available` would start the CUDA runtime, which reads CUDA_VISIBLE_DEVICES once."""
    import torch

    count = torch.cuda.device_count()
    return Device("cuda", count, os.environ.get(VISIBLE)) if count else Device("cpu", 1)


@contextmanager
def hidden_gpus() -> Iterator[Device]:
    """This node's device, with its GPUs hidden from this process while the block runs
    (CUDA_VISIBLE_DEVICES="", restored after). The update's own process only selects, checks and launches:
    CUDA initialised here would hold a context (about 500 MiB) on a GPU for the whole training, and
    LLaMA-Factory, imported here, initialises CUDA when it sees a GPU. The trainer gets the node's GPUs back
    (launch_env). Hide them before anything imports LLaMA-Factory."""
    device = detect_device()
    os.environ[VISIBLE] = ""
    try:
        yield device
    finally:
        if device.visible is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = device.visible


def interface_of(addr: str) -> str | None:
    """The network interface that holds `addr` (an IP literal or a host name): the one with that address,
    else the one whose subnet contains it (127.0.0.2 -> lo); None when none does or it does not resolve."""
    try:
        ip = ipaddress.ip_address(socket.getaddrinfo(addr, None)[0][4][0].split("%")[0])
    except (OSError, ValueError):
        return None
    nets = []
    for name, addrs in psutil.net_if_addrs().items():
        for entry in addrs:
            if entry.family not in (socket.AF_INET, socket.AF_INET6) or not entry.netmask:
                continue
            own = ipaddress.ip_address(entry.address.split("%")[0])
            if own == ip:
                return name
            prefix = bin(int(ipaddress.ip_address(entry.netmask.split("/")[0]))).count("1")
            nets.append((name, ipaddress.ip_network(f"{own}/{prefix}", strict=False)))
    return next((name for name, net in nets if ip in net), None)


def collectives_on(env: dict[str, str], node_addr: str) -> None:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in `env` (unless set) name the interface that holds `node_addr`
    (launch.node_addr); said in the log. Nothing without an address."""
    if node_addr and (iface := interface_of(node_addr)):
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.setdefault(var, iface)
        log.info(
            "collectives: gloo on %s, NCCL on %s (%s holds %s)",
            env["GLOO_SOCKET_IFNAME"],
            env["NCCL_SOCKET_IFNAME"],
            iface,
            node_addr,
        )
    elif node_addr:
        log.warning("no network interface holds launch.node_addr=%s; gloo/NCCL choose their own", node_addr)


def launch_env(cfg: LaunchConfig, device: Device) -> dict[str, str]:
    """The environment of llamafactory-cli: torchrun layout, the collectives' interface and PATH."""
    env = dict(os.environ)
    collectives_on(env, cfg.node_addr)
    if cfg.nnodes > 1 and not cfg.master_port:
        raise ConfigError(
            f"launch.master_port must be node 0's torchrun port when launch.nnodes={cfg.nnodes} (got 0, which "
            "means a free port on this machine); set launch.master_port=P on every node (run.sh does)"
        )
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.pop(VISIBLE, None)  # hidden from this process (hidden_gpus): the node's own value, or none
    if device.visible is not None:
        env[VISIBLE] = device.visible
    elif device.kind == "cpu":
        env[VISIBLE] = ""  # a CPU job (the LoRA merge) takes no GPU memory on a GPU node
    env |= {
        "FORCE_TORCHRUN": "1",
        "NPROC_PER_NODE": str(cfg.nproc_per_node or device.count),
        "NNODES": str(cfg.nnodes),
        "NODE_RANK": str(cfg.node_rank),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(cfg.master_port or free_port()),
        "DISABLE_VERSION_CHECK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return env


def free_port() -> int:
    """A TCP port nothing listens on now (one node: two trainings on one machine must not share 29500)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_command() -> list[str]:
    """`llamafactory-cli` of the running interpreter's environment."""
    beside = Path(sys.executable).parent / "llamafactory-cli"
    found = str(beside) if beside.exists() else shutil.which("llamafactory-cli")
    if not found:
        raise FileNotFoundError("llamafactory-cli is not installed in this environment; run in the train environment")
    return [found]


def exit_on_signals() -> None:
    """Make SIGTERM raise SystemExit(143) and SIGINT KeyboardInterrupt, so `finally` blocks stop the
    training groups; SIGINT too when it was inherited as ignored (a run started in the background)."""

    def _exit(signum: int, _frame) -> None:
        raise SystemExit(signal_exit(signum))

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def run_training(
    recipe: Path, log_file: Path, cfg: LaunchConfig, device: Device, extra_env: dict[str, str] | None = None
) -> TrainResult:
    """Run the training to the end or the time limit; never leaves the group running. `extra_env` is added to
    the launch environment (the trackers' variables)."""
    env = launch_env(cfg, device) | (extra_env or {})
    return run_group(train_command(recipe, env), log_file, env, cfg.timeout_s, cfg.grace_s)


def train_command(recipe: Path, env: dict[str, str]) -> list[str]:
    """`llamafactory-cli train <recipe>`, or for a recipe with Baton's own keys (training.recipe.BATON_KEYS) the
    torchrun that command would start, on training.trainer_run (LLaMA-Factory's training function with
    Baton's callbacks, or the grpo workflow) instead of LLaMA-Factory's launcher; `env` (launch_env's) gets
    the repository on PYTHONPATH."""
    if not set(BATON_KEYS) & set(yaml.safe_load(recipe.read_text()) or {}):
        return [*cli_command(), "train", str(recipe)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if env.get("OPTIM_TORCH", "1").lower() in ("true", "y", "1"):  # what LLaMA-Factory's launcher sets for its torchrun
        env |= {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    layout = [f"--nnodes={env['NNODES']}", f"--node_rank={env['NODE_RANK']}"]
    layout += [f"--nproc_per_node={env['NPROC_PER_NODE']}", f"--master_addr={env['MASTER_ADDR']}"]
    layout += [f"--master_port={env['MASTER_PORT']}"]
    return [sys.executable, "-m", "torch.distributed.run", *layout, "-m", "training.trainer_run", str(recipe)]


def run_group(cmd: list[str], log_file: Path, env: dict[str, str], timeout_s: float, grace_s: float) -> TrainResult:
    """Start `cmd` in a new session, wait, and stop every group it made (torchrun workers included) on
    timeout, error or signal. The groups are listed in `<log_file>.pgid`, one per line, while it runs
    (`Group.record`: the leader's start time beside the id, so that run.sh never kills a reused pid)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pgid_file = log_file.with_name(log_file.name + ".pgid")
    become_subreaper()
    started = time.monotonic()
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    groups = {leader_group(proc.pid)}
    save_text(pgid_file, "".join(group.record() for group in groups))
    log.info("started %s (pgid %d), log %s", " ".join(cmd), proc.pid, log_file)
    timed_out = False
    try:
        while proc.poll() is None:
            if time.monotonic() - started > timeout_s:
                timed_out = True
                pgids = sorted(group.pgid for group in groups)
                log.error("training exceeded %.0f s; stopping process groups %s", timeout_s, pgids)
                break
            groups = _track(groups, pgid_file)
            reap_adopted(keep=frozenset({proc.pid}))
            time.sleep(_POLL_S)
    finally:
        groups |= descendant_groups(os.getpid())
        if groups_alive(groups):
            stop_groups(groups, grace_s)
        proc.wait()
        pgid_file.unlink(missing_ok=True)
    return TrainResult(proc.returncode, timed_out, time.monotonic() - started)


def _track(groups: set[Group], pgid_file: Path) -> set[Group]:
    """Add the groups our descendants run in (torchrun workers start sessions of their own) to the record."""
    known = {group.pgid for group in groups}
    found = {group for group in descendant_groups(os.getpid()) if group.pgid not in known}
    if not found:
        return groups
    groups = groups | found
    save_text(pgid_file, "".join(group.record() for group in sorted(groups)))
    return groups
