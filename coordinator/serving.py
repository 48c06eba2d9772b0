"""How the policy server runs on this machine: its dtype and its KV-cache size.

    choice = choose_dtype("cpu", Path("/proc/cpuinfo").read_text())      # Precision
    choice.dtype, choice.reason        # "float32", "this CPU has no native bf16 (...)"
    kv_cache_gib(model_config, "float32", sessions=32, tokens_per_request=2048)   # 4 (GiB per vLLM worker)
    load_model_config(Path("models/m"))    # its config.json, checked: ValueError naming what it lacks
    plan = serving_plan("cpu", Path("models/m"), sessions=32, max_model_len=2048)  # all of it, for one model
    fingerprint("http://127.0.0.1:8999/v1", "policy")   # what the served weights answer a fixed probe
    reload_blocker(Path("policy/v0001"))               # why vLLM cannot reload it in place, or None

On a CPU, bfloat16 is fast only with native bf16 instructions (x86:
`avx512_bf16` or `amx_bf16`; Arm: `bf16`); without them vLLM's CPU kernels
emulate it and generate several times slower than in float32 (docs/setup.md,
"Serving precision"). On an NVIDIA GPU, bfloat16 needs compute capability 8.0
(Ampere) or newer; older GPUs serve float16. `BATON_VLLM_DTYPE` forces a
dtype. A vision-language model's config.json (Qwen3-VL) keeps the language
model's shape under `text_config`: it is read from there when the top level
lacks it, as vLLM does. Standard library only: run.sh calls it before anything
else is up.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
#: bytes per element of each dtype
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: /proc/cpuinfo flags that mean native bf16 arithmetic
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ARM_BF16_FLAGS = ("bf16",)
#: the KV cache is sized with this much room over the exact need (block rounding, the scheduler's watermark)
KV_HEADROOM = 1.15


@dataclass(frozen=True)
class Precision:
    """The dtype the server runs in, and why (one sentence for the start-up log)."""

    dtype: str
    reason: str
    forced: bool = False


@dataclass(frozen=True)
class CpuInfo:
    """The parts of /proc/cpuinfo that decide the dtype (and that benchmarks record)."""

    model: str
    flags: frozenset[str]

    def relevant_flags(self) -> list[str]:
        """The SIMD and bf16 flags worth printing beside a figure."""
        keep = re.compile(r"^(avx|amx|sse4|fma|f16c|bf16|asimd|sve|neon)")
        return sorted(f for f in self.flags if keep.match(f))


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model name and feature flags of the first processor in a /proc/cpuinfo text (x86 or Arm)."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model=model or "unknown CPU", flags=flags)


def cpu_dtype(info: CpuInfo) -> Precision:
    """float32 unless the CPU has native bf16."""
    native = [f for f in (*X86_BF16_FLAGS, *ARM_BF16_FLAGS) if f in info.flags]
    if native:
        return Precision("bfloat16", f"this CPU has native bf16 ({', '.join(native)})")
    return Precision("float32", "this CPU has no native bf16 (avx512_bf16/amx_bf16 absent)")


def cuda_dtype(compute_capabilities: list[str]) -> Precision:
    """bfloat16 when every GPU has compute capability >= 8.0, else float16."""
    caps = [c.strip() for c in compute_capabilities if c.strip()]
    try:
        old = [c for c in caps if float(c) < 8.0]
    except ValueError:
        return Precision("bfloat16", f"GPU compute capability unreadable ({', '.join(caps)}); assuming bf16 support")
    if not caps:
        return Precision("bfloat16", "GPU compute capability unknown; assuming bf16 support")
    if old:
        return Precision("float16", f"GPU compute capability {', '.join(old)} < 8.0 has no bf16")
    return Precision("bfloat16", f"GPU compute capability {', '.join(sorted(set(caps)))} has bf16")


def choose_dtype(
    device: str, cpuinfo: str = "", compute_capabilities: list[str] | None = None, forced: str = ""
) -> Precision:
    """The serving dtype for `device` ("cpu" or "cuda"); `forced` (BATON_VLLM_DTYPE) wins when set.

    Raises ValueError naming the variable when `forced` is not a dtype vLLM takes.
    """
    if forced and forced != "auto":
        if forced not in DTYPES:
            raise ValueError(
                f"BATON_VLLM_DTYPE must be one of {', '.join(DTYPES)} or auto (got {forced!r}); unset it to detect"
            )
        return Precision(forced, "forced by BATON_VLLM_DTYPE", forced=True)
    if device == "cuda":
        return cuda_dtype(compute_capabilities or [])
    return cpu_dtype(parse_cpuinfo(cpuinfo))


#: the keys of a Hugging Face decoder config that size its KV cache (required, then optional)
SHAPE_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size")
OPTIONAL_SHAPE_KEYS = ("num_key_value_heads", "head_dim")


def text_config(model_config: dict) -> dict:
    """The part of a config.json that holds the language model's shape: `text_config` when the top level has no
    num_hidden_layers and it is a mapping (vision-language models: Qwen3-VL, LLaVA), else the config itself."""
    inner = model_config.get("text_config")
    if "num_hidden_layers" not in model_config and isinstance(inner, dict):
        return inner
    return model_config


def model_config_problem(model_config: object) -> str | None:
    """What makes a config.json unusable for sizing the KV cache; None when it is usable."""
    if not isinstance(model_config, dict):
        return f"must be a JSON object (got {type(model_config).__name__})"
    shape = text_config(model_config)
    for key in SHAPE_KEYS + OPTIONAL_SHAPE_KEYS:
        value = shape.get(key)
        if value is None and key in SHAPE_KEYS:
            return f"lacks {key} (missing)"
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"{key} must be an integer >= 1 (got {value!r})"
    return None


def load_model_config(model: Path) -> dict:
    """The config.json of the model folder `model`, checked (model_config_problem). Raises ValueError with the
    message for people: not readable JSON, or no shape to size the KV cache from (bad input)."""
    path = Path(model) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problem = f"is not readable JSON ({exc.msg if isinstance(exc, json.JSONDecodeError) else exc})"
    else:
        problem = model_config_problem(config)
    if problem:
        raise ValueError(
            f"model config {path} {problem}; point model_config.model (or the policy) at a "
            "Hugging Face model folder whose config.json has " + ", ".join(SHAPE_KEYS)
        )
    return config


def kv_bytes_per_token(model_config: dict, dtype: str, tensor_parallel: int = 1) -> int:
    """Bytes of K and V one token takes over every layer of a Hugging Face decoder config, on one of
    `tensor_parallel` ranks (each holds its share of the KV heads, at least one: vLLM copies a head when there
    are more ranks than heads)."""
    shape = text_config(model_config)
    layers = int(shape["num_hidden_layers"])
    heads = int(shape["num_attention_heads"])
    kv_heads = int(shape.get("num_key_value_heads") or heads)
    head_dim = int(shape.get("head_dim") or int(shape["hidden_size"]) // heads)
    return 2 * layers * math.ceil(kv_heads / tensor_parallel) * head_dim * DTYPE_BYTES[dtype]


def kv_cache_gib(
    model_config: dict,
    dtype: str,
    sessions: int,
    tokens_per_request: int,
    tensor_parallel: int = 1,
    data_parallel: int = 1,
) -> int:
    """Whole GiB of KV cache per vLLM worker (VLLM_CPU_KVCACHE_SPACE is each worker's) so that `sessions`
    requests of `tokens_per_request` tokens fit at once: a data-parallel copy serves its share of them."""
    per_token = kv_bytes_per_token(model_config, dtype, tensor_parallel)
    need = per_token * math.ceil(sessions / data_parallel) * tokens_per_request * KV_HEADROOM
    return max(1, math.ceil(need / 2**30))


@dataclass(frozen=True)
class ServingPlan:
    """How one model is served on this machine: its precision and CPU KV cache, and what decided them."""

    device: str
    precision: Precision
    kv_cache_gib: int
    sessions: int
    max_model_len: int
    cpu: CpuInfo
    compute_capabilities: tuple[str, ...]

    def record(self) -> dict:
        """The run directory's serving.json (benchmarks print it beside a figure)."""
        return {
            "device": self.device,
            "dtype": self.precision.dtype,
            "reason": self.precision.reason,
            "forced": self.precision.forced,
            "kv_cache_gib": self.kv_cache_gib if self.device == "cpu" else None,
            "sessions": self.sessions,
            "max_model_len": self.max_model_len,
            "cpu_model": self.cpu.model,
            "cpu_flags": self.cpu.relevant_flags(),
            "gpu_compute_capabilities": list(self.compute_capabilities),
            "time": time.time(),
        }


def gpu_compute_capabilities() -> list[str]:
    """Each visible GPU's compute capability as nvidia-smi says it ("8.0"); [] without nvidia-smi."""
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, check=False).stdout.split()
    except OSError:  # no nvidia-smi: the capability is unknown (bf16 assumed, and said so)
        return []


def machine(device: str, cpuinfo: Path) -> tuple[str, list[str]]:
    """What decides the dtype on this machine: its /proc/cpuinfo text and, on `device` "cuda", the GPUs'
    compute capabilities."""
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    return text, gpu_compute_capabilities() if device == "cuda" else []


def served_dtype(device: str, forced: str = "", cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The dtype this machine's vLLM computes in (choose_dtype's); "" when `forced` is no dtype (the server's
    start says so, exit 2)."""
    try:
        return choose_dtype(device, *machine(device, cpuinfo), forced).dtype
    except ValueError:
        return ""


def serving_plan(
    device: str,
    model: Path,
    sessions: int,
    max_model_len: int,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    forced: str = "",
    tensor_parallel: int = 1,
    data_parallel: int = 1,
) -> ServingPlan:
    """The plan to serve the model folder `model` on `device` ("cpu" or "cuda") with `tensor_parallel` x
    `data_parallel` vLLM workers; `forced` is BATON_VLLM_DTYPE. Raises ValueError with the message for people: a
    bad `forced`, or a config.json that cannot size the KV cache (bad input, both)."""
    text, caps = machine(device, cpuinfo)
    precision = choose_dtype(device, text, caps, forced)
    config = load_model_config(model)
    kv = kv_cache_gib(config, precision.dtype, sessions, max_model_len, tensor_parallel, data_parallel)
    return ServingPlan(device, precision, kv, sessions, max_model_len, parse_cpuinfo(text), tuple(caps))


#: a fixed greedy probe whose logprobs identify the served weights
PROBE = [{"role": "user", "content": "What is 3 + 4?\nAnswer with only the final number."}]


def fingerprint(base_url: str, model: str, timeout: float = 60.0) -> str:
    """The greedy tokens and logprobs of PROBE as JSON (they change when the served weights do).
    Raises OSError when the server does not answer, ValueError/LookupError/TypeError on an answer
    without logprobs."""
    body = {"model": model, "messages": PROBE, "max_tokens": 6, "temperature": 0, "logprobs": True}
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    tokens = reply["choices"][0]["logprobs"]["content"]
    return json.dumps([[t["token"], round(t["logprob"], 5)] for t in tokens])


def reload_blocker(model: Path) -> str | None:
    """Why vLLM cannot reload the model folder `model` in place exactly, or None when it can: a config
    that ties the output head to the embeddings with no file holding the head
    (rollout_engine/checkpoint.py)."""
    from rollout_engine.checkpoint import missing_tied_head

    embedding = missing_tied_head(Path(model))
    if embedding is None:
        return None
    return f"{model} ties its output head to {embedding} and holds no lm_head.weight"
