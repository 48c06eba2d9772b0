"""coordinator/driver/vllm_settings.py: vllm_config resolved for one node (its auto values decided from the
machine and the model), checked against the node before anything starts, and turned into vLLM's arguments.

The machine is a `Machine` built by hand (a device, its GPUs, its NUMA nodes, VLLM_CPU_OMP_THREADS_BIND);
`for_node` is also run on a faked GPU node (a stand-in nvidia-smi on PATH) to show the detection.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from coordinator.driver.vllm_settings import (
    Machine,
    ServerSettings,
    blame,
    cpu_executor,
    for_node,
    model_context,
    numa_nodes,
    refusal,
    resolve,
)
from rollout_engine.config import VllmConfig
from rollout_engine.errors import ConfigError
from tests.unit.driver.fakes import SHAPE

#: SmolLM2-135M's config.json: its own context is 8192 tokens
SMOLLM2 = {**SHAPE, "max_position_embeddings": 8192}
#: Qwen3-VL-8B's, abridged: a 256k context under text_config
QWEN3_VL = {"text_config": {**SHAPE, "max_position_embeddings": 262144}, "vision_config": {"depth": 27}}
CPU = Machine("cpu", gpus=0, numa_nodes=1)


def gpu_node(gpus: int) -> Machine:
    return Machine("cuda", gpus=gpus, numa_nodes=2)


def test_auto_on_a_cpu_is_one_worker_and_a_2048_token_context() -> None:
    settings = resolve(VllmConfig(), CPU, SMOLLM2, "/exp/log")
    assert (settings.max_model_len, settings.tensor_parallel_size, settings.data_parallel_size) == (2048, 1, 1)
    assert settings.max_model_len_source == "auto: the model's 8192 tokens, at most 2048 on a CPU"
    assert settings.args() == [
        *("--max-model-len", "2048", "--tensor-parallel-size", "1", "--data-parallel-size", "1"),
        *("--distributed-executor-backend", "uni", "--allowed-local-media-path", "/exp/log"),
    ]
    assert settings.fit_problems(CPU) == []


def test_auto_context_is_the_model_s_own_below_the_cap() -> None:
    assert model_context(SMOLLM2) == 8192 and model_context(QWEN3_VL) == 262144
    assert model_context({**SHAPE, "n_positions": 1024, "max_position_embeddings": 4096}) == 1024
    assert model_context(SHAPE) is None
    short = {**SHAPE, "max_position_embeddings": 1024}
    assert resolve(VllmConfig(), CPU, short, "/l").max_model_len == 1024
    assert resolve(VllmConfig(), gpu_node(1), short, "/l").max_model_len == 1024
    assert resolve(VllmConfig(), gpu_node(1), SMOLLM2, "/l").max_model_len == 8192
    long = resolve(VllmConfig(), gpu_node(1), QWEN3_VL, "/l")
    assert (long.max_model_len, long.max_model_len_source) == (
        32768,
        "auto: the model's 262144 tokens, at most 32768 on a GPU",
    )
    # no key that says the model's context: vLLM assumes 2048, and so does run.sh
    unknown = resolve(VllmConfig(), gpu_node(1), SHAPE, "/l")
    assert (unknown.max_model_len, unknown.max_model_len_source) == (
        2048,
        "auto: config.json does not say the model's context; 2048 assumed, as vLLM does",
    )
    explicit = resolve(VllmConfig(max_model_len=4096), CPU, SMOLLM2, "/l")
    assert (explicit.max_model_len, explicit.max_model_len_source) == (4096, "vllm_config.max_model_len")


def test_auto_data_parallel_fills_the_node_s_gpus_with_copies_of_tensor_parallel_size() -> None:
    eight = gpu_node(8)
    settings = resolve(VllmConfig(), eight, SMOLLM2, "/l")
    assert (settings.tensor_parallel_size, settings.data_parallel_size) == (1, 8)
    assert settings.args()[:8] == [
        *("--max-model-len", "8192", "--tensor-parallel-size", "1", "--data-parallel-size", "8"),
        *("--gpu-memory-utilization", "0.85"),
    ]
    assert resolve(VllmConfig(tensor_parallel_size=2), eight, SMOLLM2, "/l").data_parallel_size == 4
    # 3 GPUs, 2 per copy: one copy, one GPU left idle (said in the description)
    odd = resolve(VllmConfig(tensor_parallel_size=2), gpu_node(3), SMOLLM2, "/l")
    assert odd.data_parallel_size == 1 and odd.fit_problems(gpu_node(3)) == []
    assert "1 of the node's 3 GPUs idle" in odd.describe(gpu_node(3))


def test_the_reference_command_as_settings() -> None:
    """The reference runs `vllm serve MODEL --max-num-seqs 512 --gpu-memory-utilization 0.95 --max-model-len
    32768 --tensor-parallel-size 1 --data-parallel-size <#GPUs> --limit-mm-per-prompt '{"video": 0}'
    --allowed-local-media-path $LOG`."""
    cfg = VllmConfig(
        max_model_len=32768,
        gpu_memory_utilization=0.95,
        limit_mm_per_prompt={"video": 0},
        extra_args=["--max-num-seqs", "512"],
    )
    assert resolve(cfg, gpu_node(4), QWEN3_VL, "/exp/log").args() == [
        *("--max-model-len", "32768", "--tensor-parallel-size", "1", "--data-parallel-size", "4"),
        *("--gpu-memory-utilization", "0.95", "--limit-mm-per-prompt", '{"video": 0}'),
        *("--allowed-local-media-path", "/exp/log", "--max-num-seqs", "512"),
    ]
    none = resolve(VllmConfig(allowed_local_media_path=""), CPU, SMOLLM2, "/l").args()
    assert "--allowed-local-media-path" not in none
    elsewhere = resolve(VllmConfig(allowed_local_media_path="/data/shots"), CPU, SMOLLM2, "/l").args()
    assert elsewhere[-2:] == ["--allowed-local-media-path", "/data/shots"]


def test_one_worker_on_a_cpu_of_one_numa_node_runs_in_vllm_s_engine_process() -> None:
    """The uni executor where vllm-cpu would bind nothing it needs a process of its own for; vLLM's choice
    wherever it binds workers to NUMA nodes or given cores, on a GPU, and where extra_args names the executor."""
    settings = resolve(VllmConfig(), CPU, SMOLLM2, "/l")
    assert settings.executor == "uni"
    assert settings.args()[6:8] == ["--distributed-executor-backend", "uni"]
    assert settings.env() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    uni = "; the worker in the engine core's process (uni executor), forked from the server"
    assert settings.describe(CPU).endswith(uni)
    assert cpu_executor(CPU, 2, ()) == ""
    assert cpu_executor(gpu_node(1), 1, ()) == ""
    assert cpu_executor(Machine("cpu", 0, numa_nodes=2), 1, ()) == ""
    assert cpu_executor(Machine("cpu", 0, numa_nodes=1, cpu_bind="0-3"), 1, ()) == ""
    assert cpu_executor(Machine("cpu", 0, numa_nodes=1, cpu_bind="nobind"), 1, ()) == ""
    assert cpu_executor(Machine("cpu", 0, numa_nodes=1, simulated_numa=True), 1, ()) == ""
    assert cpu_executor(CPU, 1, ("--max-num-seqs", "8")) == "uni"
    own = resolve(VllmConfig(extra_args=["--distributed_executor_backend=mp"]), CPU, SMOLLM2, "/l")
    assert (own.executor, own.env(), own.engine_fork) == ("", {}, False)
    assert own.args()[-1] == "--distributed_executor_backend=mp"
    assert "--distributed-executor-backend" not in own.args()
    on_gpus = resolve(VllmConfig(), gpu_node(1), SMOLLM2, "/l")
    assert (on_gpus.executor, on_gpus.env(), on_gpus.engine_fork) == ("", {}, False)
    assert "executor" not in on_gpus.describe(gpu_node(1))


def test_the_engine_core_is_forked_where_the_uni_executor_runs_unless_the_user_says_spawn() -> None:
    """vllm-cpu spawns its engine core, which then imports vLLM again; with the uni executor (no worker process
    to bind) run.sh forks it (coordinator/vllm_serve.py), and BATON_VLLM_ENGINE_FORK=0 keeps vLLM's spawn."""
    assert resolve(VllmConfig(), CPU, SMOLLM2, "/l").engine_fork
    env = {"BATON_DEVICE": "cpu", "CPU_VISIBLE_MEMORY_NODES": "0"}
    assert Machine.detect(env).engine_fork and Machine.detect({**env, "BATON_VLLM_ENGINE_FORK": "1"}).engine_fork
    spawned = Machine.detect({**env, "BATON_VLLM_ENGINE_FORK": "0"})
    settings = resolve(VllmConfig(), spawned, SMOLLM2, "/l")
    assert (settings.executor, settings.engine_fork) == ("uni", False)
    assert settings.describe(spawned).endswith("(uni executor)")


def test_parallel_sizes_must_fit_the_node_s_gpus() -> None:
    two = gpu_node(2)
    too_wide = resolve(VllmConfig(tensor_parallel_size=4), two, SMOLLM2, "/l")
    assert too_wide.fit_problems(two) == [
        "vllm_config.tensor_parallel_size must be <= 2, the GPUs this node may use (got 4); lower it, or set it "
        "for this node's group in the node file (node_groups[].vllm_config, docs/serving.md)"
    ]
    too_many = resolve(VllmConfig(tensor_parallel_size=2, data_parallel_size=2), two, SMOLLM2, "/l")
    assert too_many.fit_problems(two) == [
        "vllm_config.tensor_parallel_size x data_parallel_size must be <= 2, the GPUs this node may use (got 2 x 2 "
        "= 4); lower data_parallel_size (0 = auto: 1 here), or set them for this node's group in the node file "
        "(node_groups[].vllm_config, docs/serving.md)"
    ]
    none = gpu_node(0)
    assert resolve(VllmConfig(), none, SMOLLM2, "/l").fit_problems(none) == [
        "no GPU to serve on: nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES names none; give the job a GPU, or "
        "set BATON_DEVICE=cpu"
    ]


def test_on_a_cpu_each_worker_needs_a_numa_node_or_a_core_list_of_its_own() -> None:
    """vllm-cpu (vLLM 0.32's vllm/utils/ompmultiprocessing.py) binds each worker's OpenMP threads to a NUMA node
    of its own (VLLM_CPU_OMP_THREADS_BIND=auto, the default), or to the core lists given there (one per worker,
    separated by |); nobind binds nothing."""
    two = VllmConfig(tensor_parallel_size=2)
    one_numa = resolve(two, CPU, SMOLLM2, "/l")
    assert one_numa.fit_problems(CPU) == [
        "vllm_config.tensor_parallel_size x data_parallel_size must be <= 1, this node's NUMA nodes, on a CPU (got "
        "2 x 1 = 2): vllm-cpu binds each worker to a NUMA node of its own; lower them, or give each worker its "
        "cores: VLLM_CPU_OMP_THREADS_BIND=0-15|16-31 (one list per worker)"
    ]
    assert one_numa.fit_problems(Machine("cpu", 0, numa_nodes=2)) == []
    assert one_numa.fit_problems(Machine("cpu", 0, numa_nodes=1, cpu_bind="0-3|4-7")) == []
    assert one_numa.fit_problems(Machine("cpu", 0, numa_nodes=1, cpu_bind="nobind")) == []
    assert one_numa.fit_problems(Machine("cpu", 0, numa_nodes=1, simulated_numa=True)) == []
    assert one_numa.fit_problems(Machine("cpu", 0, numa_nodes=4, cpu_bind="0-15")) == [
        "VLLM_CPU_OMP_THREADS_BIND must give one core list per vLLM worker, 2 here (vllm_config.tensor_parallel_size "
        "x data_parallel_size = 2 x 1; got 1: '0-15'); separate the lists with |, e.g. 0-15|16-31"
    ]


def test_numa_nodes_are_those_this_process_may_use(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nMems_allowed:\t00000000,00000003\nMems_allowed_list:\t0-1,3\n")
    assert numa_nodes(status, {}) == 3
    assert numa_nodes(status, {"CPU_VISIBLE_MEMORY_NODES": "1,3,7"}) == 2
    assert numa_nodes(tmp_path / "none", {}) == 1


def model(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_for_node_refuses_every_problem_at_once_naming_the_settings(tmp_path: Path) -> None:
    """policy_config.max_new_tokens=8192 with the CPU's auto 2048-token context passes every check of the config
    (auto is resolved per node): for_node refuses it, with the parallel sizes that do not fit."""
    folder = model(tmp_path / "m", SMOLLM2)
    with pytest.raises(ConfigError) as err:
        for_node(VllmConfig(tensor_parallel_size=2), folder, "/l", max_new_tokens=8192, machine=CPU)
    assert err.value.problems == [
        "vllm_config.tensor_parallel_size x data_parallel_size must be <= 1, this node's NUMA nodes, on a CPU (got "
        "2 x 1 = 2): vllm-cpu binds each worker to a NUMA node of its own; lower them, or give each worker its "
        "cores: VLLM_CPU_OMP_THREADS_BIND=0-15|16-31 (one list per worker)",
        "policy_config.max_new_tokens must leave at least 256 tokens of vllm_config.max_model_len for the prompt "
        "(got 8192 of 2048, auto: the model's 8192 tokens, at most 2048 on a CPU); lower "
        "policy_config.max_new_tokens to <= 1792, or raise vllm_config.max_model_len to >= 8448",
    ]
    assert for_node(VllmConfig(), folder, "/l", max_new_tokens=256, machine=CPU).max_model_len == 2048
    with pytest.raises(ConfigError, match=r"config.json is not readable JSON"):
        for_node(VllmConfig(), tmp_path / "none", "/l", machine=CPU)


def test_for_node_detects_a_gpu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Detected, not assumed: nvidia-smi lists 4 GPUs, CUDA_VISIBLE_DEVICES leaves this job 2."""
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    smi = fakebin / "nvidia-smi"
    listing = "; ".join(f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"' for i in range(4))
    smi.write_text(f'#!/bin/sh\ncase "$1" in -L) {listing} ;; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fakebin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("BATON_DEVICE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    machine = Machine.detect()
    assert (machine.device, machine.gpus) == ("cuda", 2)
    settings = for_node(VllmConfig(), model(tmp_path / "m", SMOLLM2), "/l")
    assert (settings.device, settings.data_parallel_size, settings.max_model_len) == ("cuda", 2, 8192)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size must be <= 2, the GPUs this node may use \(got 4\)"):
        for_node(VllmConfig(tensor_parallel_size=4), model(tmp_path / "m2", SMOLLM2), "/l")


USAGE = "usage: api_server.py [-h] [--headless]\n                     [--model MODEL]\n"


def test_refusal_is_the_message_of_vllm_s_argument_parser() -> None:
    assert refusal(USAGE + "api_server.py: error: unrecognized arguments: --bogus\n") == (
        "unrecognized arguments: --bogus"
    )
    assert refusal("INFO 11-28 starting\nTraceback (most recent call last):\nValueError: error: no memory\n") is None
    assert refusal("") is None


def test_blame_names_the_setting_that_gave_the_refused_argument() -> None:
    settings = ServerSettings("cpu", 2048, 1, 1, 0.85, {"video": 0}, "", ("--max-num-seqs", "lots"))
    assert blame("argument --max-num-seqs: invalid int value: 'lots'", settings) == "vllm_config.extra_args"
    assert blame("argument --limit-mm-per-prompt: Value {bad", settings) == "vllm_config.limit_mm_per_prompt"
    assert blame("unrecognized arguments: --bogus", settings) == "vllm_config.extra_args"
