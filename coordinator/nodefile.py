"""Per-node settings for clusters whose machines differ (node groups, as in RLinf's cluster config).

    python -m coordinator node-env --node-file nodes.yaml --rank 2 --num-nodes 4   # `export K=V` lines

A node file maps node ranks to what differs between machines:

    node_groups:
      - label: a100                  # a name for messages
        node_ranks: 0-1              # "3", "0-7", "0,2,5-6"; every rank in at most one group
        env_vars:                    # exported on those nodes before anything starts
          GLOO_SOCKET_IFNAME: eth0
          VLLM_CPU_OMP_THREADS_BIND: "0-15"
        python:                      # interpreters of the Python environments (default: the built ones)
          serve: /opt/vllm/bin/python
          train: /opt/llamafactory/bin/python
        vllm_port: 8999              # this group's vLLM port (BATON_VLLM_PORT)
        node_addr: 10.0.0.5          # only for a group of one rank (BATON_NODE_ADDR)
        vllm_config:                 # vLLM's settings on these ranks, over the run's (docs/serving.md)
          tensor_parallel_size: 2

A rank in no group keeps the defaults. Every problem is reported at once
(ConfigError: field, value, fix), before anything starts: a vllm_config value is checked
as the rollout config checks it (rollout_engine.config.vllm_config_problems).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine.config import removed_variable_problem, vllm_config_problems
from rollout_engine.errors import ConfigError

GROUP_KEYS = {"label", "node_ranks", "env_vars", "python", "vllm_port", "node_addr", "vllm_config"}
PYTHONS = {"app": "BATON_APP_PY", "serve": "BATON_SERVE_PY", "train": "BATON_TRAIN_PY"}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RANKS = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


@dataclass
class NodeGroup:
    label: str
    node_ranks: list[int]
    env_vars: dict[str, str] = field(default_factory=dict)
    python: dict[str, str] = field(default_factory=dict)
    vllm_port: int | None = None
    node_addr: str | None = None
    #: vllm_config's values for these ranks (checked): they win over the run's
    vllm_config: dict[str, Any] = field(default_factory=dict)


def parse_ranks(text: str) -> list[int]:
    """ "0-2,5" -> [0, 1, 2, 5]; raises ValueError on anything else."""
    text = str(text).replace(" ", "")
    if not RANKS.fullmatch(text):
        raise ValueError(text)
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if high and int(high) < int(low):
            raise ValueError(text)
        ranks.extend(range(int(low), int(high or low) + 1))
    return ranks


#: a node file describes groups of ranks: even a run of thousands of nodes fits in a few KiB
MAX_NODE_FILE_BYTES = 2**20


def load_node_file(path: Path, num_nodes: int) -> list[NodeGroup]:
    """Read and check a node file against the run's node count."""
    import yaml

    where = f"--node-file {path}"
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist; give the path of a YAML node file (docs/multinode.md)") from None
    if len(raw) > MAX_NODE_FILE_BYTES:
        raise ConfigError(
            f"{where} is {len(raw) / 2**20:.1f} MiB, over the 1 MiB a node file may be (a group per line of "
            "ranks, not per node: node_ranks: 0-999); give the right file or write it with rank ranges"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{where} is not UTF-8 text ({exc.reason} on line {line}); save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where} is not valid YAML ({why}{at}); fix the YAML (docs/multinode.md)") from None
    groups_data = data.get("node_groups") if isinstance(data, dict) else data
    if not isinstance(data, dict) or not isinstance(groups_data, list) or not groups_data:
        raise ConfigError(
            f"{where} needs a non-empty list node_groups (got {groups_data!r}); "
            "e.g. node_groups: [{label: a100, node_ranks: 0-1}]"
        )
    problems: list[str] = []
    groups = [_group(i, g, num_nodes, problems) for i, g in enumerate(groups_data)]
    seen: dict[int, str] = {}
    for group in groups:
        for rank in group.node_ranks:
            if rank in seen:
                problems.append(f"rank {rank} is in node groups {seen[rank]!r} and {group.label!r}; give it to one")
            seen[rank] = group.label
    if problems:
        raise ConfigError([f"{where}: {p}" for p in problems])
    return groups


def _group(index: int, data: Any, num_nodes: int, problems: list[str]) -> NodeGroup:
    at = f"node_groups[{index}]"
    if not isinstance(data, dict):
        problems.append(f"{at} must be a mapping with label and node_ranks (got {data!r})")
        return NodeGroup(at, [])
    unknown = sorted(set(data) - GROUP_KEYS)
    if unknown:
        problems.append(f"{at} has unknown keys {unknown}; known: {', '.join(sorted(GROUP_KEYS))}")
    label = str(data.get("label", at))
    try:
        ranks = parse_ranks(data["node_ranks"])
    except (KeyError, ValueError):
        problems.append(f"{at}.node_ranks must look like 3, 0-7 or 0,2,5-6 (got {data.get('node_ranks')!r})")
        ranks = []
    outside = [r for r in ranks if r >= num_nodes]
    if outside:
        problems.append(
            f"{at}.node_ranks {outside} are outside 0..{num_nodes - 1} (--num-nodes {num_nodes}); "
            f"use ranks below {num_nodes}, or raise --num-nodes"
        )
    env_vars = data.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(ENV_NAME.fullmatch(str(k)) for k in env_vars):
        problems.append(f"{at}.env_vars must map variable names to values (got {env_vars!r})")
        env_vars = {}
    problems += [f"{at}.env_vars: {p}" for p in map(removed_variable_problem, map(str, env_vars)) if p]
    python = data.get("python") or {}
    if not isinstance(python, dict) or set(python) - set(PYTHONS):
        problems.append(f"{at}.python must map {', '.join(PYTHONS)} to interpreter paths (got {python!r})")
        python = {}
    port = data.get("vllm_port")
    if port is not None and not (isinstance(port, int) and 1 <= port <= 65535):
        problems.append(f"{at}.vllm_port must be a TCP port 1..65535 (got {port!r})")
    addr = data.get("node_addr")
    if addr is not None and len(ranks) != 1:
        problems.append(f"{at}.node_addr names one node's address; give it in a group of one rank (got {ranks})")
    vllm = data.get("vllm_config") or {}
    if not isinstance(vllm, dict):
        problems.append(
            f"{at}.vllm_config must map vllm_config settings to values (got {vllm!r}); e.g. "
            "vllm_config: {tensor_parallel_size: 2}"
        )
        vllm = {}
    found = vllm_config_problems(vllm)
    problems += [f"{at}.{p}" for p in found]
    env = {str(k): str(v) for k, v in env_vars.items()}
    return NodeGroup(label, ranks, env, dict(python), port, addr, {} if found else {str(k): v for k, v in vllm.items()})


def node_env(groups: list[NodeGroup], rank: int) -> dict[str, str]:
    """The variables to export on `rank` (empty when it is in no group); its interpreters must be runnable."""
    group = next((g for g in groups if rank in g.node_ranks), None)
    if group is None:
        return {}
    env = dict(group.env_vars)
    problems = []
    for name, path in group.python.items():
        if not Path(path).is_file():
            problems.append(
                f"node group {group.label!r}: python.{name} {path} does not exist on this node; "
                "install it there, or fix that path in the node file"
            )
        env[PYTHONS[name]] = str(path)
    if problems:
        raise ConfigError(problems)
    if group.vllm_port is not None:
        env["BATON_VLLM_PORT"] = str(group.vllm_port)
    if group.node_addr:
        env["BATON_NODE_ADDR"] = str(group.node_addr)
    return env


def node_vllm(groups: list[NodeGroup], rank: int) -> dict[str, Any]:
    """The vllm_config values of `rank`'s group (empty when it is in no group)."""
    group = next((g for g in groups if rank in g.node_ranks), None)
    return dict(group.vllm_config) if group is not None else {}


def export_lines(env: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
