"""The warm trainer: one set of trainer processes per run that trains every iteration's update.

    python -m training.warm --dir <run>/trainer --log <run>/logs/trainer.log [--nproc P]   # the driver starts it
        [--nnodes N --node-rank R --master-addr A --master-port P [--node-addr B]]       # one of N nodes

A fresh update pays for three Python processes that import the stack and load LLaMA-Factory
(`python -m training`, `llamafactory-cli`, the torchrun worker) before its first optimizer step.
Here torchrun's workers start once, import once, and then wait for jobs: each job is the
argument list of `python -m training` (its Hydra overrides), run in-process. A job that trains
(phase train or all) runs on every worker: rank 0 prepares, every rank trains (LLaMA-Factory's
own training function), rank 0 merges a LoRA (its export function) and promotes. Any other job
(prepare, promote, check: on several nodes the master hands those to its own trainer alone)
runs on rank 0 by itself while the others answer at once. On several nodes the workers of
every node form one process group (torchrun's static rendezvous at the master's address and
torchrun port).
The process group and DeepSpeed's state stay up between jobs: LLaMA-Factory destroys the
process group when a training ends, which a later DeepSpeed training cannot survive.

The files in `--dir` (the driver's side: coordinator/driver/trainer.py):

    ready.json         {"pid", "nproc", "nnodes", "node_rank"}: local rank 0 is up (every node's workers
                       joined the process group) and waits for jobs
    job.json           {"seq", "argv", "log"}: the driver's request, replaced atomically
    started.json       {"seq", "timeout_s"}: local rank 0 began job `seq`, whose launch.timeout_s is that
    done.<r>.json      {"seq", "exit", "wall_s"}: local rank r finished job `seq` with `exit`
                       (the exit codes of `python -m training`; FRESH: not a job for this trainer), and
                       what stayed after it: "tensors_alive_mib" (any device), and once CUDA started
                       "gpu_allocated_mib", "gpu_reserved_mib" (its CUDA context not counted)

A worker that fails inside a training (its partners may wait in a collective) or passes the
job's `launch.timeout_s` exits: the driver sees the group end, the update fails, and the
next update starts a fresh trainer. The driver stops a trainer that is still at it
GRACE_S after that deadline (a stopped worker runs no watchdog).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rollout_engine.exits import Exit
from rollout_engine.files import save_json

log = logging.getLogger("training.warm")
POLL_S = 0.2
#: the files in a trainer's folder (the module docstring says what each holds)
READY, JOB, STARTED = "ready.json", "job.json", "started.json"


def done_name(local_rank: int | str) -> str:
    """The file in which local rank `local_rank` reports each job it finished."""
    return f"done.{local_rank}.json"


#: a job's exit when it wants another layout than this trainer's (launch.nproc_per_node, launch.nnodes): the
#: driver runs it in fresh processes
FRESH = 86


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, so LLaMA-Factory's and the C++ libraries'
    output too) appended to `path` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for each in (fd, *saved):
            os.close(each)


@contextmanager
def environment(extra: dict[str, str]) -> Iterator[None]:
    """`extra` in os.environ for the block (a job's tracker variables), the old values after."""
    before = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def train_in_process(recipe: Path, log_file: Path, extra_env: dict[str, str]):
    """LLaMA-Factory's training function on `recipe` in this process (every rank calls it, through
    training.trainer_run as the fresh path does), its output
    appended to `log_file`; the process group it would destroy at the end is kept (the next job uses it).
    Returns a launch.TrainResult; an exception propagates (the worker then exits: see the module doc)."""
    import torch
    import torch.distributed as dist
    import yaml

    from training import trainer_run
    from training.launch import TrainResult

    args = yaml.safe_load(recipe.read_text())
    started = time.monotonic()
    keep = dist.destroy_process_group
    dist.destroy_process_group = lambda *a, **k: None
    try:
        with output_to(log_file), environment(extra_env):
            try:
                trainer_run.run(args, [])
            except Exception:
                traceback.print_exc()  # the log's last lines: training.update.refusal reads them
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                    _exit_now("a training failed; its partners may wait in a collective: the warm trainer exits")
                return TrainResult(Exit.FAILED, False, time.monotonic() - started)
    finally:
        dist.destroy_process_group = keep
        release_memory(torch)
    return TrainResult(0, False, time.monotonic() - started)


def export_in_process(recipe: Path, log_file: Path) -> int:
    """LLaMA-Factory's export (a LoRA merged into its base model) on `recipe` in this process, as `llamafactory-cli
    export` runs it (export_device cpu: no GPU memory), its output appended to `log_file`; the exit code that
    command would give."""
    import torch
    import yaml
    from llamafactory.train import tuner

    args = yaml.safe_load(recipe.read_text())
    try:
        with output_to(log_file):
            try:
                tuner.export_model(args)
            except Exception:
                traceback.print_exc()
                return Exit.FAILED
    finally:
        release_memory(torch)
    return 0


def release_memory(torch) -> None:
    """Give back what the training freed: the model and optimizer (garbage once the training function
    returned and DeepSpeed let go of it), cached GPU blocks, and the C heap's free pages (glibc
    keeps them otherwise: 2.8 GB of RSS stayed with an idle worker after a training of the default model)."""
    release_deepspeed()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        with contextlib.suppress(AttributeError):  # cuBLAS's workspaces sit in the caching allocator until cleared
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def release_deepspeed() -> int:
    """Let go of what DeepSpeed keeps of a training that returned; the number of engines destroyed. Three things
    keep the model, its gradients and the optimizer's moments alive (4 GiB of the default model under ZeRO-2,
    2.5 GiB under ZeRO-3; on the GPU when there is one):
    - a ZeRO optimizer's hooks on every parameter's gradient accumulator, a C++ object whose references gc does
      not follow (the cycle parameter -> hook -> optimizer -> parameter): DeepSpeedEngine.destroy removes them;
    - ZeRO-3's module-level FWD_MODULE_STACK, onto which each engine puts its model and which nothing empties
      (between jobs no forward pass is under way);
    - ZeRO-3's unbounded lru_cache on PartitionedParameterCoordinator.__params_to_release, keyed by the
      coordinator and each module."""
    if "deepspeed" not in sys.modules:
        return 0
    from deepspeed.runtime.engine import DeepSpeedEngine

    engines = [obj for obj in gc.get_objects() if issubclass(type(obj), DeepSpeedEngine)]
    for engine in engines:
        try:
            engine.destroy()
        except Exception:  # the memory guard after the job says what stayed
            log.warning("destroying a DeepSpeed engine after the training failed", exc_info=True)
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    if isinstance(getattr(offload, "FWD_MODULE_STACK", None), list):
        offload.FWD_MODULE_STACK.clear()
    coordinator = sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator")
    for method in vars(getattr(coordinator, "PartitionedParameterCoordinator", object)).values():
        for inner in [method, *(getattr(method, "__closure__", None) or ())]:  # under deepspeed's nvtx wrapper
            with contextlib.suppress(ValueError):  # an empty cell
                inner = getattr(inner, "cell_contents", inner)
                if callable(getattr(inner, "cache_clear", None)):
                    inner.cache_clear()
    return len(engines)


#: GPU memory a worker may keep allocated between updates (its CUDA context is not counted); above it, it exits
KEEP_GPU_BYTES = 256 << 20


def gpu_memory_kept(torch=None) -> int:
    """Bytes of GPU memory tensors still hold in this process (0 without CUDA or before it was initialised)."""
    if torch is None:
        import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    return max(torch.cuda.memory_allocated(device) for device in range(torch.cuda.device_count()))


def tensors_alive_mib() -> float:
    """MiB of the storages of the tensors still alive in this process, on any device: after a job, what its
    model and optimizer left behind (a reference cycle through C++ autograd hooks, which gc cannot break, keeps
    them; on a GPU that is memory vLLM cannot have)."""
    import torch

    storages: dict[tuple[str, int], int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta:  # type(): a dead weak proxy's __class__ raises
            with contextlib.suppress(RuntimeError):  # a tensor without storage (sparse, functional wrappers)
                storage = obj.untyped_storage()
                storages[(str(obj.device), storage.data_ptr())] = storage.nbytes()
    return round(sum(storages.values()) / 2**20, 1)


def gpu_memory_held(torch=None) -> dict[str, float]:
    """This process's GPU memory after a job, MiB (the most on any device): what tensors hold and what the
    caching allocator reserves; nothing without CUDA or before it was initialised."""
    if torch is None:
        import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    allocated = gpu_memory_kept(torch)
    reserved = max(torch.cuda.memory_reserved(device) for device in range(torch.cuda.device_count()))
    return {"gpu_allocated_mib": round(allocated / 2**20, 1), "gpu_reserved_mib": round(reserved / 2**20, 1)}


class Worker:
    """One torchrun worker's loop: wait for a job, run it, report it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.node_rank = int(os.environ.get("GROUP_RANK", "0"))
        self.done = 0

    def start(self) -> None:
        """Import the stack and join the process group, then say so."""
        import torch
        import torch.distributed as dist
        from llamafactory.train import tuner  # noqa: F401  (the import a fresh trainer pays every update)

        if self.world > 1 and not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        from training.config import register_configs

        register_configs()
        if self.local_rank == 0:
            ready = {"pid": os.getpid(), "nproc": self.nproc, "nnodes": self.world // self.nproc}
            save_json(self.dir / READY, ready | {"node_rank": self.node_rank})
        log.info("warm trainer rank %d of %d ready", self.rank, self.world)

    def next_job(self) -> dict:
        """Wait for a job newer than the last one done."""
        path = self.dir / JOB
        while True:
            try:
                job = json.loads(path.read_text())
                if int(job["seq"]) > self.done:
                    return job
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(POLL_S)

    def serve(self) -> None:
        self.start()
        while True:
            job = self.next_job()
            started = time.monotonic()
            code, everyone = self.run_job(job)
            self.done = int(job["seq"])
            save_json(
                self.dir / done_name(self.local_rank),
                {"seq": self.done, "exit": code, "wall_s": round(time.monotonic() - started, 2)}
                | {"tensors_alive_mib": tensors_alive_mib()}
                | gpu_memory_held(),
            )
            # only after a job every worker ran: most_kept is a collective, and a training is what fills a GPU
            if everyone and (kept := self.most_kept()) > KEEP_GPU_BYTES:
                # vLLM wakes up into what this process holds: step aside (the next update starts a new trainer)
                log.error("the warm trainer keeps %d MiB of GPU memory after the update; it exits", kept >> 20)
                sys.stderr.flush()
                os._exit(0)

    def most_kept(self) -> int:
        """gpu_memory_kept of the worker that keeps the most (every worker asks after every job: all of them
        exit together, or none)."""
        kept = gpu_memory_kept()
        if self.world == 1:
            return kept
        import torch.distributed as dist

        everyone: list[int] = [0] * self.world
        dist.all_gather_object(everyone, kept)
        return max(everyone)

    def run_job(self, job: dict) -> tuple[int, bool]:
        """The job's `python -m training` in this process: its exit code, and whether every worker ran it (a job
        that trains; any other runs on rank 0 alone, the others answer 0 at once)."""
        argv = list(job["argv"])
        if not trains(argv):
            if self.rank != 0:
                return 0, False
            with output_to(Path(job["log"])):
                return run_argv(argv, self, int(job["seq"]), alone=True), False
        with output_to(Path(job["log"])):
            return run_argv(argv, self, int(job["seq"])), True


def _read(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _seq(record: dict) -> int:
    try:
        return int(record.get("seq", 0))
    except (TypeError, ValueError):
        return 0


def job_running(directory: Path) -> str:
    """What the trainer in `directory` works on now: "update-check" or "update" while its job is handed over
    and not yet answered by local rank 0; "" when it waits for one (or was never handed one)."""
    job = _read(directory / JOB)
    if not job or _seq(job) <= _seq(_read(directory / done_name(0))):
        return ""
    return "update-check" if job_phase(job.get("argv", [])) == "check" else "update"


def job_started(directory: Path) -> list[str] | None:
    """The arguments of the job that local rank 0 of the trainer in `directory` began and has not finished
    (its STARTED names the job, its done file does not yet); None while it works on none."""
    job = _read(directory / JOB)
    seq = _seq(job)
    if not seq or _seq(_read(directory / STARTED)) != seq or _seq(_read(directory / done_name(0))) == seq:
        return None
    return [str(arg) for arg in job.get("argv", [])]


def job_phase(argv: list[str]) -> str:
    """The phase `python -m training` runs for `argv`: its last phase= (as in Hydra), else "all"."""
    return next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("phase=")), "all")


def trains(argv: list[str]) -> bool:
    """The job runs a training (phase=train or all, the default): every worker takes part."""
    return job_phase(argv) in ("train", "all")


def compose(argv: list[str]):
    """The update config `python -m training --config-name update <argv>` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from training.__main__ import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name="update", overrides=argv)


def run_argv(argv: list[str], worker: Worker, seq: int, alone: bool = False) -> int:
    """`python -m training`'s run on `argv`, with the training in-process (training.__main__._run); `alone`: a
    job rank 0 runs by itself (no collective with the other workers), whatever layout it names."""
    from training import update
    from training.__main__ import _run
    from training.launch import detect_device

    try:
        dict_cfg = compose(argv)
    except Exception as exc:  # Hydra refuses an override: what python -m training exits 2 for
        log.error("bad config:\n%s", exc)
        return Exit.BAD_INPUT
    launch = dict_cfg.launch
    wanted = (int(launch.nproc_per_node) or detect_device().count, int(launch.nnodes), int(launch.node_rank))
    have = (worker.nproc, worker.world // worker.nproc, worker.node_rank)
    if not alone and wanted != have:
        said = "%s worker(s) a node on %s node(s), as node %s"
        log.error(f"the warm trainer runs {said}; this update wants {said}", *have, *wanted)
        return FRESH
    timeout_s = float(dict_cfg.launch.timeout_s)
    if worker.local_rank == 0:  # the driver's deadline too: a stopped (SIGSTOP) worker runs no watchdog
        save_json(worker.dir / STARTED, {"seq": seq, "timeout_s": timeout_s})
    watchdog = threading.Timer(timeout_s, _expired, args=(timeout_s,))
    watchdog.daemon = True
    watchdog.start()
    try:
        rank, world = (0, 1) if alone else (worker.rank, worker.world)
        with update.in_process(rank, world, train_in_process, _share, export_in_process):
            return _run(dict_cfg, detect_device())
    finally:
        watchdog.cancel()


def _share(code: int) -> int:
    """Rank 0's `code` on every rank (a prepare that found nothing to train ends the job everywhere)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return code
    box = [code]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def _expired(timeout_s: float) -> None:
    _exit_now(f"training exceeded {timeout_s:.0f} s (launch.timeout_s); the warm trainer exits")


def _exit_now(why: str) -> None:
    log.error("%s", why)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(Exit.FAILED)


@dataclass(frozen=True)
class Placement:
    """Where a trainer's workers run: `nproc` on this node, node `node_rank` of `nnodes`, the process group's
    store at `master_addr`:`master_port` (0: a free port, one node), the collectives on the interface that
    holds `node_addr` (training.launch.launch_env says the same of a fresh training)."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    node_addr: str = ""

    def args(self) -> list[str]:
        """The command-line arguments that say it (main below reads them)."""
        args = [f"--nproc={self.nproc}", f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}"]
        args += [f"--master-addr={self.master_addr}", f"--master-port={self.master_port}"]
        return args + ([f"--node-addr={self.node_addr}"] if self.node_addr else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.warm")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, help="the trainer's own output (the parent: starts torchrun)")
    parser.add_argument("--nproc", type=int, default=0, help="workers on this node; 0 = the local GPUs (1 on CPU)")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=0, help="node 0's store; 0 = a free port (one node)")
    parser.add_argument("--node-addr", default="", help="this node's address: the collectives use its interface")
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--worker", action="store_true", help="(torchrun's workers)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", stream=sys.stderr)
    if args.worker:
        Worker(args.dir).serve()
        return 0
    where = Placement(args.nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port, args.node_addr)
    return launch(args.dir, args.log, where, args.grace)


def launch(directory: Path, log_file: Path, where: Placement, grace_s: float) -> int:
    """This node's workers, tracked and stopped like a fresh training (training.launch.run_group): one worker
    by itself (its process group's rendezvous at `where`'s master address and port), several under torchrun;
    runs until the driver stops it or a worker exits."""
    from training.launch import collectives_on, exit_on_signals, free_port, run_group

    exit_on_signals()
    directory.mkdir(parents=True, exist_ok=True)
    nproc = where.nproc
    if nproc == 0:  # the driver counts the GPUs (it passes --nproc); by hand, ask torch
        from training.launch import detect_device

        nproc = detect_device().count
    if where.nnodes > 1 and not where.master_port:
        raise SystemExit(f"--master-port must be node 0's torchrun port with --nnodes {where.nnodes}")
    worker = ["-m", "training.warm", "--worker", "--dir", str(directory)]
    env = {**os.environ, "DISABLE_VERSION_CHECK": "1", "TOKENIZERS_PARALLELISM": "false"}
    collectives_on(env, where.node_addr)
    port = str(where.master_port or free_port())
    if nproc == 1:  # what torchrun would set for one worker a node, without its agent (a process of ~500 MB)
        rank, world = str(where.node_rank), str(where.nnodes)
        env |= {"RANK": rank, "GROUP_RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"MASTER_ADDR": where.master_addr, "MASTER_PORT": port}
        cmd = [sys.executable, *worker]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={where.nnodes}"]
        cmd += [f"--node-rank={where.node_rank}", f"--nproc-per-node={nproc}"]
        cmd += [f"--master-addr={where.master_addr}", f"--master-port={port}", *worker]
    code = run_group(cmd, log_file, env, float("inf"), grace_s).returncode
    if code < 0:  # torchrun says the same of its workers ("Signal 9 (SIGKILL)"): the driver reads it here too
        log.error("the worker exited: Signal %d (%s)", -code, signal.Signals(-code).name)
    return code


if __name__ == "__main__":
    sys.exit(main())
