"""The node file: per-node environment variables, interpreters, port and address by rank; every problem named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coordinator.nodefile import export_lines, load_node_file, node_env, node_vllm, parse_ranks
from rollout_engine.errors import ConfigError

GOOD = f"""
node_groups:
  - label: big
    node_ranks: 0-1
    env_vars: {{GLOO_SOCKET_IFNAME: eth0, VLLM_CPU_OMP_THREADS_BIND: "0-15"}}
    python: {{train: {sys.executable}}}
    vllm_port: 9001
  - label: odd
    node_ranks: "3"
    node_addr: 10.0.0.7
    env_vars: {{NOTE: "it's quoted"}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    return path


def test_ranks_in_ranges_and_lists() -> None:
    assert parse_ranks("0-2,5") == [0, 1, 2, 5] and parse_ranks(3) == [3]
    for bad in ("2-1", "a", "1,,2", "-1"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_each_rank_gets_its_groups_settings_and_others_none(tmp_path: Path) -> None:
    groups = load_node_file(write(tmp_path, GOOD), num_nodes=4)
    env = node_env(groups, 1)
    assert env == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "VLLM_CPU_OMP_THREADS_BIND": "0-15",
        "BATON_TRAIN_PY": sys.executable,
        "BATON_VLLM_PORT": "9001",
    }
    assert node_env(groups, 2) == {}
    assert node_env(groups, 3) == {"NOTE": "it's quoted", "BATON_NODE_ADDR": "10.0.0.7"}
    assert "export NOTE='it'\"'\"'s quoted'\n" in export_lines(node_env(groups, 3))


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    text = """
node_groups:
  - label: a
    node_ranks: 0-2
    vllm_port: 70000
    colour: red
  - label: b
    node_ranks: 2,9
    node_addr: 10.0.0.1
    python: {gpu: /x}
"""
    with pytest.raises(ConfigError) as err:
        load_node_file(write(tmp_path, text), num_nodes=4)
    message = str(err.value)
    assert "node_groups[0] has unknown keys ['colour']" in message
    assert "node_groups[0].vllm_port must be a TCP port 1..65535 (got 70000)" in message
    assert "node_groups[1].node_ranks [9] are outside 0..3 (--num-nodes 4)" in message
    assert "node_groups[1].node_addr names one node's address" in message
    assert "node_groups[1].python must map app, serve, train to interpreter paths" in message
    assert "rank 2 is in node groups 'a' and 'b'; give it to one" in message


def test_missing_file_bad_yaml_and_a_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist; give the path of a YAML node file"):
        load_node_file(tmp_path / "nope.yaml", 2)
    with pytest.raises(ConfigError, match="needs a non-empty list node_groups"):
        load_node_file(write(tmp_path, "node_groups: []\n"), 2)
    groups = load_node_file(write(tmp_path, "node_groups: [{node_ranks: 0, python: {serve: /no/python}}]\n"), 2)
    with pytest.raises(ConfigError, match=r"python\.serve /no/python does not exist on this node"):
        node_env(groups, 0)


def test_a_group_s_vllm_config_is_for_its_ranks_only(tmp_path: Path) -> None:
    """A group of 4-GPU nodes serves an 8B model tensor-parallel over 2 GPUs (2 copies each); the others keep
    the run's settings. The values go to the rollout config, not the environment."""
    text = """
node_groups:
  - label: four-gpus
    node_ranks: 1-2
    vllm_config: {tensor_parallel_size: 2, limit_mm_per_prompt: {video: 0}, extra_args: [--max-num-seqs, 512]}
"""
    groups = load_node_file(write(tmp_path, text), num_nodes=4)
    assert (
        node_vllm(groups, 1)
        == node_vllm(groups, 2)
        == {
            "tensor_parallel_size": 2,
            "limit_mm_per_prompt": {"video": 0},
            "extra_args": ["--max-num-seqs", 512],
        }
    )
    assert node_vllm(groups, 0) == {} and node_env(groups, 1) == {}


def test_a_group_s_vllm_config_is_checked_as_the_rollout_config_checks_it(tmp_path: Path) -> None:
    text = """
node_groups:
  - node_ranks: 0
    vllm_config: {tensor_parallel_size: 0, gpu_memory_utilization: lots, tensor_paralel_size: 2}
  - node_ranks: 1
    vllm_config: {data_parallel_size: -1, extra_args: [--port, "9000"]}
  - node_ranks: 2
    vllm_config: [tensor_parallel_size, 2]
  - node_ranks: 3
    env_vars: {VLLM_MAX_MODEL_LEN: "4096"}
"""
    with pytest.raises(ConfigError) as err:
        load_node_file(write(tmp_path, text), num_nodes=4)
    message = str(err.value)
    assert "node_groups[0].vllm_config has no settings ['tensor_paralel_size']; known: max_model_len, " in message
    assert "node_groups[1].vllm_config.data_parallel_size must be 0 (auto) or >= 1 (got -1)" in message
    assert "node_groups[1].vllm_config.extra_args must not set --port (got '--port'): set BATON_VLLM_PORT" in message
    assert "node_groups[2].vllm_config must map vllm_config settings to values (got ['tensor_parallel_size', 2])" in (
        message
    )
    assert "node_groups[3].env_vars: VLLM_MAX_MODEL_LEN is no longer read" in message
    assert "pass vllm_config.max_model_len=VALUE (or set it in a node group's vllm_config" in message
    wrong = "node_groups:\n  - {node_ranks: 0, vllm_config: {tensor_parallel_size: 0, gpu_memory_utilization: lots}}\n"
    with pytest.raises(ConfigError) as err:
        load_node_file(write(tmp_path, wrong), num_nodes=1)
    where = f"--node-file {tmp_path / 'nodes.yaml'}: node_groups[0].vllm_config"
    assert err.value.problems == [
        f"{where}.gpu_memory_utilization cannot be 'lots' (Value 'lots' of type 'str' could not be converted to "
        "Float); give it a value of its type",
        f"{where}.tensor_parallel_size must be >= 1 (got 0)",
    ]
