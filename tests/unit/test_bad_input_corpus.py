"""The bad-input corpus (issue 11): malformed inputs of every surface, one table.

Each case must exit 2 with exactly one error that names the field, the bad value
and a fix, and leave every file as it was (same files, same bytes; a log path
that did not exist still does not exist). The surfaces are called as run.sh
calls them, in-process: `python -m coordinator compose` (Hydra overrides, the
base model folder), `... serving` (the model's config.json), `... node-env`
(--node-file); task files and journals through the loaders the rollout and the
update call, with their entry points' mapping (ConfigError -> exit 2). run.sh's
own flags are in tests/shell/bad_input_corpus.bats.

    pytest tests/unit/test_bad_input_corpus.py -q
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coordinator.__main__ import build_parser
from coordinator.driver import cli, say
from coordinator.protocol_cli import dispatch
from rollout_engine.errors import ConfigError
from rollout_engine.history import load_trajectories
from rollout_engine.layout import Layout
from rollout_engine.tasks import load_tasks
from tests.unit.training.trajectories import traj

#: a phrase that tells what to do instead
FIX = re.compile(
    r"must |use |choose|e\.g\.|set |remove|drop |add |give |pass |point |fix |move |rename|install|known:|one of"
    r"|finish |run |run:",
    re.IGNORECASE,
)
#: a small Hugging Face decoder config (enough for coordinator.serving's KV-cache sizing)
MODEL_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}


@dataclass(frozen=True)
class Case:
    """One malformed input: what is given, and what the error must name."""

    id: str
    surface: str  # override | model | task | trajectory | nodefile | path | ...
    bad: object  # the surface's input: overrides, file text, a model folder's config.json, ...
    field: str
    value: str
    extra: dict = field(default_factory=dict)


def _task(**row: object) -> str:
    return json.dumps({"task_id": "t1", "task_name": "add", "difficulty": 1, **row})


def _traj(**change: object) -> str:
    row = traj("t1", 0, True).to_json()
    row.update(change)
    return json.dumps({k: v for k, v in row.items() if v is not _DROP})


_DROP = object()
#: the example environment of docs/examples/my_envs (env=custom), and the folder that makes it importable
_GUESS = "env._target_=my_envs.guess.GuessNumberEnv"
_MINE = "env_config.python_path=[{mine}]"
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_envs"
#: a line over the 16 MiB an input line may hold
HUGE = 17 * 2**20
_GOOD_TRAJ = json.dumps(traj("t0", 0, True).to_json())


CASES = [
    # Hydra overrides, as run.sh passes them to `python -m coordinator compose`
    Case(
        "override-env_config.server_size-zero", "override", ["env_config.server_size=0"], "env_config.server_size", "0"
    ),
    Case(
        "override-env_config.max_vllm_sessions-negative",
        "override",
        ["env_config.max_vllm_sessions=-1"],
        "env_config.max_vllm_sessions",
        "-1",
    ),
    Case("override-server_size-not-an-integer", "override", ["env_config.server_size=abc"], "server_size", "abc"),
    Case("override-revert-set-by-run.sh", "override", ["revert.to_version=3"], "revert.to_version", "3"),
    Case("override-seed-not-an-integer", "override", ["seed=ten"], "seed", "ten"),
    Case("override-algorithm.cutoff_len-zero", "override", ["algorithm.cutoff_len=0"], "algorithm.cutoff_len", "0"),
    Case(
        "override-per_device_train_batch_size-zero",
        "override",
        ["algorithm.per_device_train_batch_size=0"],
        "algorithm.per_device_train_batch_size",
        "0",
    ),
    Case(
        "override-warmup_steps-and-warmup_ratio-both-set",
        "override",
        ["algorithm.warmup_steps=5", "algorithm.warmup_ratio=0.1"],
        "algorithm.warmup_steps",
        "5",
    ),
    Case("override-max_steps-zero", "override", ["algorithm.max_steps=0"], "algorithm.max_steps", "0"),
    Case(
        "override-learning_rate-negative", "override", ["algorithm.learning_rate=-1"], "algorithm.learning_rate", "-1"
    ),
    Case(
        "override-last_k_iterations-zero",
        "override",
        ["algorithm.selection.last_k_iterations=0"],
        "algorithm.selection.last_k_iterations",
        "0",
    ),
    Case("override-val_split_ratio-one", "override", ["data.val_split_ratio=1.5"], "data.val_split_ratio", "1.5"),
    Case("override-nproc_per_node-negative", "override", ["launch.nproc_per_node=-2"], "launch.nproc_per_node", "-2"),
    Case("override-keep_last-zero", "override", ["promotion.keep_last=0"], "promotion.keep_last", "0"),
    Case("override-unknown-key", "override", ["algorithm.learnign_rate=1e-5"], "algorithm.learnign_rate", "1e-5"),
    Case("override-env-unknown-choice", "override", ["env=chess"], "env", "chess"),
    Case("override-tracker-unknown-choice", "override", ["tracker=mlflow"], "tracker", "mlflow"),
    Case("override-reserved-data_path", "override", ["data_path=/elsewhere"], "data_path", "/elsewhere"),
    Case("override-reserved-iteration", "override", ["iteration=7"], "iteration", "7"),
    Case("override-reserved-model_path", "override", ["model_path=/m"], "model_path", "/m"),
    Case(
        "override-policy-base_url-without-debug-mode",
        "override",
        ["policy_config.base_url=http://h:1/v1"],
        "policy_config.base_url",
        "http://h:1/v1",
    ),
    Case(
        "override-data.demonstrations-missing",
        "override",
        ["data.demonstrations=/nonexistent/demos"],
        "data.demonstrations",
        "/nonexistent/demos",
    ),
    Case(
        "override-data.demonstrations-relative",
        "override",
        ["data.demonstrations=[demos]"],
        "data.demonstrations",
        "'demos'",
    ),
    Case(
        "override-demonstration_samples-negative",
        "override",
        ["data.demonstration_samples=-5"],
        "data.demonstration_samples",
        "-5",
    ),
    Case("override-malformed-syntax", "override", ["env_config.server_size=[1"], "env_config.server_size", "[1"),
    # an environment of the user's own (docs/environments.md): run.sh's compose builds it and checks its tasks
    # before anything starts; {mine}: docs/examples/my_envs copied outside the repository, {t}: the test's folder
    Case("env-target-unimportable", "env", [_GUESS], "env._target_", "no module named 'my_envs'"),
    Case("env-target-not-dotted", "env", ["env._target_=GuessNumberEnv"], "env._target_", "'GuessNumberEnv'"),
    Case("env-target-module-misspelt", "env", [_GUESS.replace("guess.", "gues."), _MINE], "env._target_", "gues"),
    Case("env-target-class-misspelt", "env", ["env._target_=my_envs.guess.Guess", _MINE], "env._target_", "Guess'"),
    Case("env-target-a-function", "env", ["env._target_=my_envs.tasks.main", _MINE], "env._target_", "a function"),
    Case("env-target-not-an-env", "env", ["env._target_=pathlib.Path", _MINE], "env._target_", "pathlib.Path"),
    Case("env-target-abstract", "env", ["env._target_=rollout_engine.envs.base.Env"], "env._target_", "abstract"),
    Case("env-target-raises-on-import", "env", ["env._target_=my_envs.broken.X", _MINE], "env._target_", "NameError"),
    Case("env-custom-without-target", "env", [], "env._target_", "got nothing"),
    Case(
        "env-python_path-missing", "env", [_GUESS, "env_config.python_path=[{t}/nowhere]"], "python_path[0]", "nowhere"
    ),
    Case("env-python_path-relative-missing", "env", [_GUESS, "env_config.python_path=[envs]"], "python_path", "envs"),
    Case(
        "env-python_path-a-file",
        "env",
        [_GUESS, "env_config.python_path=[{mine}/pyproject.toml]"],
        "env_config.python_path[0]",
        "pyproject.toml",
    ),
    Case("env-python_path-empty-entry", "env", [_GUESS, "env_config.python_path=['']"], "python_path[0]", "''"),
    Case("env-parameter-unknown", "env", [_GUESS, _MINE, "+env.max_gueses=6"], "max_gueses", "max_gueses"),
    Case("env-parameter-out-of-range", "env", [_GUESS, _MINE, "+env.max_guesses=0"], "env.max_guesses", "0"),
    # vllm_config (docs/serving.md), as compose checks it
    Case(
        "override-max_new_tokens-leaves-no-room-in-max_model_len",
        "override",
        ["vllm_config.max_model_len=2048", "policy_config.max_new_tokens=8192"],
        "policy_config.max_new_tokens",
        "(got 8192 of 2048)",
    ),
    Case(
        "override-vllm_config.tensor_parallel_size-zero",
        "override",
        ["vllm_config.tensor_parallel_size=0"],
        "vllm_config.tensor_parallel_size",
        "0",
    ),
    Case(
        "override-vllm_config.extra_args-sets-a-setting-s-flag",
        "override",
        ["vllm_config.extra_args=[--gpu-memory-utilization,0.9]"],
        "vllm_config.gpu_memory_utilization",
        "--gpu-memory-utilization",
    ),
    Case(
        "override-vllm_config.allowed_local_media_path-relative",
        "override",
        ["vllm_config.allowed_local_media_path=logs"],
        "vllm_config.allowed_local_media_path",
        "'logs'",
    ),
    Case(
        "override-vllm_config.limit_mm_per_prompt-negative",
        "override",
        ["+vllm_config.limit_mm_per_prompt={video:-1}"],
        "vllm_config.limit_mm_per_prompt.video",
        "-1",
    ),
    Case(
        "override-vllm_config.limit_mm_per_prompt-without-the-plus",
        "override",
        ["vllm_config.limit_mm_per_prompt={video:0}"],
        "+vllm_config.limit_mm_per_prompt",
        "{video:0}",
    ),
    # vllm_config against this node, as run.sh's driver resolves it (a CPU node of one NUMA node)
    Case(
        "node-max_new_tokens-over-the-auto-context",
        "node",
        ["policy_config.max_new_tokens=8192"],
        "vllm_config.max_model_len",
        "(got 8192 of 2048, auto",
    ),
    Case(
        "node-tensor_parallel_size-over-the-numa-nodes",
        "node",
        ["vllm_config.tensor_parallel_size=2"],
        "vllm_config.tensor_parallel_size",
        "2 x 1 = 2",
    ),
    # removed variables, as run.sh's driver checks the environment
    Case(
        "variable-VLLM_MAX_MODEL_LEN-removed",
        "variable",
        {"VLLM_MAX_MODEL_LEN": "4096"},
        "VLLM_MAX_MODEL_LEN",
        "max_model_len",
    ),
    # model folders: the base model run.sh composes with (model_config.model), and its config.json (serving)
    Case("model-folder-missing", "model", None, "model_path", "nomodel"),
    Case("model-folder-without-config.json", "model", {}, "model_path", "model"),
    Case("model-config.json-is-a-folder", "model", {"config.json/": ""}, "model_path", "model"),
    Case("model-config.json-not-json", "serving", "{num_hidden_layers: 2", "config.json", "model"),
    Case("model-config.json-not-an-object", "serving", "[2, 4]", "config.json", "list"),
    Case(
        "model-config.json-lacks-num_hidden_layers",
        "serving",
        json.dumps({k: v for k, v in MODEL_CONFIG.items() if k != "num_hidden_layers"}),
        "num_hidden_layers",
        "missing",
    ),
    Case(
        "model-config.json-text_config-lacks-num_hidden_layers",
        "serving",
        json.dumps({"text_config": {k: v for k, v in MODEL_CONFIG.items() if k != "num_hidden_layers"}}),
        "num_hidden_layers",
        "missing",
    ),
    Case(
        "model-config.json-num_attention_heads-not-a-number",
        "serving",
        json.dumps({**MODEL_CONFIG, "num_attention_heads": "four"}),
        "num_attention_heads",
        "four",
    ),
    Case(
        "model-config.json-num_attention_heads-zero",
        "serving",
        json.dumps({**MODEL_CONFIG, "num_attention_heads": 0, "num_key_value_heads": 0}),
        "num_attention_heads",
        "0",
    ),
    # task files (docs/formats.md "Task files"), as the rollout loads them
    Case("task-file-missing", "task", None, "task file", "tasks.jsonl"),
    Case("task-file-empty", "task", "\n\n", "task file", "tasks.jsonl"),
    Case("task-line-not-json", "task", '{"task_id": "t1", ', "task file", '{"task_id": "t1",'),
    Case("task-line-an-array", "task", '["t1", "add"]', "JSON object", "list"),
    Case("task-line-a-string", "task", '"t1"', "JSON object", "str"),
    Case("task-lacks-task_id", "task", json.dumps({"task_name": "add"}), "task_id", "tasks.jsonl:1"),
    Case("task-empty-task_id", "task", _task(task_id=""), "task_id", "''"),
    Case("task-lacks-task_name", "task", json.dumps({"task_id": "t1"}), "task_name", "tasks.jsonl:1"),
    Case("task-null-task_name", "task", _task(task_name=None), "task_name", "None"),
    Case("task-difficulty-zero", "task", _task(difficulty=0), "difficulty", "0"),
    Case("task-difficulty-a-word", "task", _task(difficulty="hard"), "difficulty", "'hard'"),
    Case("task-difficulty-a-bool", "task", _task(difficulty=True), "difficulty", "True"),
    Case("task-difficulty-a-float", "task", _task(difficulty=1.5), "difficulty", "1.5"),
    Case("task-metadata-a-list", "task", _task(metadata=[1, 2]), "metadata", "list"),
    Case("task-duplicate-task_id", "task", _task() + "\n" + _task(), "task_id", "'t1'"),
    Case("task-file-latin-1", "task", b'{"task_id": "t1", "task_name": "caf\xe9"}', "tasks.jsonl:1", "not UTF-8"),
    Case("task-file-utf-16", "task", _task().encode("utf-16"), "tasks.jsonl:1", "not UTF-8"),
    Case("task-file-gzip", "task", gzip.compress(_task().encode(), mtime=0), "tasks.jsonl:1", "not UTF-8"),
    Case("task-file-nul-bytes", "task", "\x00" * 64, "tasks.jsonl:1", "not valid JSON"),
    Case("task-line-truncated-mid-file", "task", _task() + "\n" + _task(task_id="t2")[:30], "tasks.jsonl:2", "t2"),
    Case("task-line-huge", "task", _task(metadata={"page": "x" * HUGE}), "tasks.jsonl:1", "16 MiB"),
    Case("task-env-not-a-string", "task", _task(env=3), "env", "3"),
    Case("task-family-not-a-string", "task", _task(family=["a"]), "family", "['a']"),
    # trajectory journals, as the update reads them (rollout_engine.history.load_trajectories)
    Case("trajectory-line-an-array", "trajectory", "[1, 2]", "rank_0.jsonl:2", "list"),
    Case("trajectory-line-a-number", "trajectory", "42", "rank_0.jsonl:2", "int"),
    Case("trajectory-lacks-status", "trajectory", _traj(status=_DROP), "status", "rank_0.jsonl:2"),
    Case("trajectory-status-unknown", "trajectory", _traj(status="exploded"), "status", "exploded"),
    Case("trajectory-unknown-field", "trajectory", _traj(colour="red"), "colour", "rank_0.jsonl:2"),
    Case("trajectory-turns-not-objects", "trajectory", _traj(turns=["hi"]), "turns", "hi"),
    Case("trajectory-turn-unknown-field", "trajectory", _traj(turns=[{"index": 0, "bogus": 1}]), "bogus", ":2"),
    Case("trajectory-lacks-task_id", "trajectory", _traj(task_id=_DROP), "task_id", "rank_0.jsonl:2"),
    # demonstrations (data.demonstrations), as run.sh composes the update config with them
    Case("demonstration-line-not-json", "demonstration", '{"episode_id": "t1#0", ', "demonstrations.jsonl:2", "t1#0"),
    Case("demonstration-line-an-array", "demonstration", "[1, 2]", "demonstrations.jsonl:2", "list"),
    Case("demonstration-lacks-status", "demonstration", _traj(status=_DROP), "data.demonstrations", "'status'"),
    Case("demonstration-file-empty", "demonstration", b"", "data.demonstrations", "holds no demonstrations"),
    Case("demonstration-line-latin-1", "demonstration", b'{"task_id": "caf\xe9"}', "demonstrations.jsonl:2", "UTF-8"),
    Case("demonstration-episode-twice", "demonstration", _GOOD_TRAJ, "demonstrations.jsonl:2", "'t0#0'"),
    Case("demonstration-line-huge", "demonstration", _traj(task_id="t" * HUGE), "demonstrations.jsonl:2", "16 MiB"),
    Case("trajectory-manifest-not-json", "manifest", "{complete: yes", "manifest.json", "complete: yes"),
    Case("trajectory-two-ranks-no-manifest", "two_ranks", None, "manifest.json", "2 ranks"),
    # --data-path and --log-path, as run.sh's driver checks them ({t}: the test's folder; {t}/data exists)
    Case("path-data-missing", "path", ("{t}/nodata", "{t}/log"), "--data-path", "/nodata"),
    Case("path-data-a-file", "path", ("{t}/file", "{t}/log"), "--data-path", "/file"),
    Case("path-data-relative", "path", ("data", "{t}/log"), "--data-path", "'data'"),
    Case("path-data-control-character", "path", ("{t}/data\r", "{t}/log"), "--data-path", "\\r"),
    Case("path-log-relative", "path", ("{t}/data", "log"), "--log-path", "'log'"),
    Case("path-log-a-file", "path", ("{t}/data", "{t}/file"), "--log-path", "/file"),
    Case("path-log-under-a-file", "path", ("{t}/data", "{t}/file/log"), "--log-path", "/file/log"),
    Case("path-log-is-the-data-path", "path", ("{t}/data", "{t}/data/"), "--log-path", "/data"),
    Case("path-log-newline", "path", ("{t}/data", "{t}/log\nb"), "--log-path", "\\nb"),
    Case("path-log-huge-name", "path", ("{t}/data", "{t}/" + "n" * 256), "--log-path", "256 bytes"),
    Case("path-log-huge", "path", ("{t}/data", "{t}" + "/p" * 2100), "--log-path", "bytes long"),
    # what --resume reads of the interrupted iteration (iteration 1, its state folder without an end marker),
    # checked by run.sh's driver before anything starts: {"file": text} under trajectories/train/iter_0001/
    Case("resume-journal-not-a-trajectory", "resume", {"rank_0.jsonl": '{"a": 1}'}, "rank_0.jsonl:2", "trajectory"),
    Case("resume-journal-an-array", "resume", {"rank_0.jsonl": "[1, 2]"}, "rank_0.jsonl:2", "list"),
    Case("resume-journal-episode-twice", "resume", {"rank_0.jsonl": _GOOD_TRAJ}, "rank_0.jsonl:2", "'t0#0'"),
    Case(
        "resume-takeover-journal-not-a-trajectory",
        "resume",
        {"rank_0.takeover_1.jsonl": "42"},
        "rank_0.takeover_1.jsonl:2",
        "int",
    ),
    Case(
        "resume-manifest-not-json", "resume", {"rank_0.manifest.json": "{complete"}, "rank_0.manifest.json", "{complete"
    ),
    Case("resume-manifest-a-list", "resume", {"rank_0.manifest.json": "[]"}, "rank_0.manifest.json", "[]"),
    Case("resume-merged-manifest-empty", "resume", {"manifest.json": ""}, "manifest.json", "''"),
    Case("resume-journal-a-folder", "resume", {"rank_0.jsonl/": ""}, "rank_0.jsonl", "folder"),
    # the node file (--node-file), as run.sh reads it: `python -m coordinator node-env`
    Case("nodefile-missing", "nodefile", None, "--node-file", "nodes.yaml"),
    Case("nodefile-not-yaml", "nodefile", "node_groups: [label: a\n  - x", "--node-file", "nodes.yaml"),
    Case("nodefile-not-a-mapping", "nodefile", "- a\n- b\n", "node_groups", "['a', 'b']"),
    Case("nodefile-empty-node_groups", "nodefile", "node_groups: []\n", "node_groups", "[]"),
    Case("nodefile-group-not-a-mapping", "nodefile", "node_groups: [gpu]\n", "node_groups[0]", "gpu"),
    Case(
        "nodefile-unknown-key", "nodefile", "node_groups:\n- {node_ranks: 0, vllm_prot: 9}\n", "vllm_prot", "vllm_prot"
    ),
    Case("nodefile-node_ranks-missing", "nodefile", "node_groups:\n- {label: a}\n", "node_ranks", "None"),
    Case("nodefile-node_ranks-malformed", "nodefile", "node_groups:\n- {node_ranks: 0-}\n", "node_ranks", "0-"),
    Case("nodefile-node_ranks-reversed", "nodefile", "node_groups:\n- {node_ranks: 3-1}\n", "node_ranks", "3-1"),
    Case(
        "nodefile-node_ranks-outside", "nodefile", "node_groups:\n- {node_ranks: 0-5}\n", "node_ranks", "[2, 3, 4, 5]"
    ),
    Case(
        "nodefile-rank-in-two-groups",
        "nodefile",
        "node_groups:\n- {label: a, node_ranks: 0-1}\n- {label: b, node_ranks: 1}\n",
        "rank 1",
        "'b'",
    ),
    Case(
        "nodefile-env_vars-bad-name",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, env_vars: {1BAD: x}}\n",
        "env_vars",
        "1BAD",
    ),
    Case(
        "nodefile-env_vars-a-list", "nodefile", "node_groups:\n- {node_ranks: 0, env_vars: [A]}\n", "env_vars", "['A']"
    ),
    Case(
        "nodefile-python-unknown-env",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, python: {judge: /usr/bin/python3}}\n",
        "python",
        "judge",
    ),
    Case(
        "nodefile-python-not-on-this-node",
        "nodefile",
        "node_groups:\n- {label: a, node_ranks: 0, python: {serve: /nonexistent/bin/python}}\n",
        "python.serve",
        "/nonexistent/bin/python",
    ),
    Case(
        "nodefile-vllm_port-too-big",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_port: 70000}\n",
        "vllm_port",
        "70000",
    ),
    Case(
        "nodefile-vllm_port-a-word",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_port: http}\n",
        "vllm_port",
        "http",
    ),
    Case(
        "nodefile-vllm_config-unknown-setting",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_config: {tensor_paralel_size: 2}}\n",
        "vllm_config",
        "tensor_paralel_size",
    ),
    Case(
        "nodefile-vllm_config-tensor_parallel_size-zero",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_config: {tensor_parallel_size: 0}}\n",
        "vllm_config.tensor_parallel_size",
        "0",
    ),
    Case(
        "nodefile-vllm_config-a-word",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_config: {max_model_len: long}}\n",
        "vllm_config.max_model_len",
        "'long'",
    ),
    Case(
        "nodefile-vllm_config-a-list",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, vllm_config: [tensor_parallel_size]}\n",
        "vllm_config",
        "['tensor_parallel_size']",
    ),
    Case(
        "nodefile-env_vars-a-removed-variable",
        "nodefile",
        "node_groups:\n- {node_ranks: 0, env_vars: {VLLM_MAX_MODEL_LEN: 4096}}\n",
        "VLLM_MAX_MODEL_LEN",
        "vllm_config.max_model_len",
    ),
    Case("nodefile-empty", "nodefile", "", "node_groups", "None"),
    Case("nodefile-latin-1", "nodefile", b"node_groups:\n- {label: caf\xe9, node_ranks: 0}\n", "--node-file", "UTF-8"),
    Case("nodefile-huge", "nodefile", "# padding\n" * (HUGE // 10), "--node-file", "1 MiB"),
    Case(
        "nodefile-node_addr-in-a-group-of-two",
        "nodefile",
        "node_groups:\n- {node_ranks: 0-1, node_addr: 10.0.0.5}\n",
        "node_addr",
        "[0, 1]",
    ),
]


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root: a file's bytes, None for a folder."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _cli(argv: list[str]) -> int:
    return dispatch(build_parser().parse_args(argv))


def _driver_cli(argv: list[str], env: dict[str, str] | None = None) -> int:
    """run.sh's command line as its driver checks it (coordinator.driver.run: BadInput -> its lines, exit 2)."""
    try:
        cli.validate(cli.parse(argv), {"PWD": "/work", **(env or {})})
    except say.BadInput as exc:
        print("\n".join(say.error_lines(exc)), file=sys.stderr)
        return exc.code
    return 0


def _driver_compose(argv: list[str], base_model: Path) -> int:
    """run.sh's compose as its driver runs it before anything starts (coordinator.driver.run.compose: with the
    splits it rolls out, their task files and environment); the import path and modules as they were after."""
    from coordinator.driver.run import compose

    path, modules = list(sys.path), set(sys.modules)
    try:
        compose(cli.parse(argv), str(base_model), None)
    except say.Ended as exc:
        print("\n".join(say.error_lines(exc)), file=sys.stderr)
        return exc.code
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            del sys.modules[name]
    return 0


def _node_compose(data: Path, log: Path, overrides: list[str]) -> int:
    """run.sh's driver composing a rollout's configuration on a CPU node of one NUMA node (coordinator.driver.run
    compose: vllm_config resolved for the node; Die -> its lines, exit 2), the resolved config saved on success."""
    from unittest import mock

    from coordinator.driver import run as driver_run
    from coordinator.driver.vllm_settings import Machine

    args = cli.Args(data=str(data), log=str(log), phase="rollout", split="train-only", overrides=overrides)
    try:
        with mock.patch.object(Machine, "detect", return_value=Machine("cpu", 0, 1)):
            driver_run.compose(args, str(data / "model"), log / "resolved.yaml")
    except say.Die as exc:
        print("\n".join(say.error_lines(exc)), file=sys.stderr)
        return exc.code
    return 0


def _resume_check(log: Path) -> int:
    """What run.sh's driver reads before anything starts on --resume (coordinator.driver.resume)."""
    from coordinator.driver.resume import check_resume

    try:
        check_resume(Layout(log), rank=0)
    except say.BadInput as exc:
        print("\n".join(say.error_lines(exc)), file=sys.stderr)
        return exc.code
    return 0


def _entry_point(load: Callable[[], object]) -> int:
    """The rollout's and the update's mapping (rollout_engine.__main__, training.__main__): ConfigError -> 2."""
    try:
        load()
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


def _model(folder: Path, bad: object) -> None:
    """A model folder: a dict of file name -> text ("name/" for a folder), or config.json's text."""
    folder.mkdir(parents=True)
    files = bad if isinstance(bad, dict) else {"config.json": bad}
    for name, text in files.items():
        if name.endswith("/"):
            (folder / name).mkdir()
        else:
            (folder / name).write_text(text)


def _run(case: Case, tmp: Path) -> tuple[Path, Callable[[], int]]:
    """Build the case's files under tmp; return the folder to watch and the call."""
    data, log = tmp / "data", tmp / "log"
    data.mkdir()
    compose = ["compose", "--data-path", str(data), "--log-path", str(log), "--save", str(log / "resolved.yaml")]
    if case.surface == "override":
        _model(data / "model", json.dumps(MODEL_CONFIG))
        return tmp, lambda: _cli([*compose, "--base-model", str(data / "model"), "--", *case.bad])
    if case.surface == "env":
        _model(data / "model", json.dumps(MODEL_CONFIG))
        mine = tmp / "elsewhere" / "my_envs"
        shutil.copytree(EXAMPLE, mine)
        (mine / "my_envs" / "broken.py").write_text("undefined_name()\n")
        (data / "tasks").mkdir()
        (data / "tasks" / "train.jsonl").write_text(_task(metadata={"low": 1, "high": 8, "secret": 3}) + "\n")
        overrides = [o.format(mine=mine, t=tmp) for o in ["env=custom", *case.bad]]
        argv = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--dry-run"]
        argv += ["--data-path", str(data), "--log-path", str(log), *overrides]
        return tmp, lambda: _driver_compose(argv, data / "model")
    if case.surface == "node":
        _model(data / "model", json.dumps(MODEL_CONFIG))
        (data / "tasks").mkdir()
        (data / "tasks" / "train.jsonl").write_bytes(_RG_TASK + b"\n")
        return tmp, lambda: _node_compose(data, log, case.bad)
    if case.surface == "variable":
        return tmp, lambda: _driver_cli(
            ["--rl-phase", "update", "--data-path", str(data), "--log-path", str(log)], case.bad
        )
    if case.surface == "model":
        folder = data / ("nomodel" if case.bad is None else "model")
        if case.bad is not None:
            _model(folder, case.bad)
        return tmp, lambda: _cli([*compose, "--base-model", str(folder)])
    if case.surface == "serving":
        _model(data / "model", case.bad)
        argv = ["serving", "--device", "cpu", "--model", str(data / "model"), "--cpuinfo", str(tmp / "none")]
        return tmp, lambda: _cli([*argv, "--record", str(log / "serving.json")])
    if case.surface == "demonstration":
        _model(data / "model", json.dumps(MODEL_CONFIG))
        (data / "demos").mkdir()
        bad = case.bad if isinstance(case.bad, bytes) else (_GOOD_TRAJ + "\n" + case.bad + "\n").encode()
        if bad and isinstance(case.bad, bytes):
            bad = (_GOOD_TRAJ + "\n").encode() + case.bad + b"\n"
        (data / "demos" / "demonstrations.jsonl").write_bytes(bad)
        demos = f"data.demonstrations={data / 'demos'}"
        return tmp, lambda: _cli([*compose, "--base-model", str(data / "model"), "--", demos])
    if case.surface == "task":
        path = data / "tasks.jsonl"
        if isinstance(case.bad, bytes):
            path.write_bytes(case.bad + b"\n")
        elif case.bad is not None:
            path.write_text(case.bad + "\n")
        return tmp, lambda: _entry_point(lambda: load_tasks(path))
    if case.surface == "path":
        (tmp / "file").write_text("")
        data_path, log_path = (text.format(t=tmp) for text in case.bad)
        argv = ["--rl-phase", "update", "--data-path", data_path, "--log-path", log_path]
        return tmp, lambda: _driver_cli(argv)
    if case.surface == "resume":
        (data / "models" / "m").mkdir(parents=True)
        (log / "run" / "state" / "iter_0001").mkdir(parents=True)
        folder = log / "trajectories" / "train" / "iter_0001"
        folder.mkdir(parents=True)
        for name, text in case.bad.items():
            if name.endswith("/"):
                (folder / name).mkdir()
            else:
                (folder / name).write_text((_GOOD_TRAJ + "\n" + text + "\n") if name.endswith(".jsonl") else text)
        return tmp, lambda: _resume_check(log)
    if case.surface == "nodefile":
        path = data / "nodes.yaml"
        if case.bad is not None:
            path.write_bytes(case.bad if isinstance(case.bad, bytes) else case.bad.encode())
        return tmp, lambda: _cli(["node-env", "--node-file", str(path), "--rank", "0", "--num-nodes", "2"])
    # journals of iteration 1 under an existing log path
    folder = log / "trajectories" / "train" / "iter_0001"
    folder.mkdir(parents=True)
    if case.surface == "trajectory":
        (folder / "rank_0.jsonl").write_text(_GOOD_TRAJ + "\n" + case.bad + "\n")
    elif case.surface == "manifest":
        (folder / "rank_0.jsonl").write_text(_GOOD_TRAJ + "\n")
        (folder / "manifest.json").write_text(case.bad)
    else:  # two ranks' journals, never merged by the master
        (folder / "rank_0.jsonl").write_text(_GOOD_TRAJ + "\n")
        (folder / "rank_1.jsonl").write_text(_GOOD_TRAJ + "\n")
    return tmp, lambda: _entry_point(lambda: load_trajectories(log, "train", [1]))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("BATON_VLLM_DTYPE", raising=False)
    root, call = _run(case, tmp_path)
    before = _snapshot(root)
    code = call()
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if re.match(r"(\[baton\] )?error:", line)]
    assert code == 2, (code, err)
    assert out == ""
    assert len(errors) == 1, err
    assert case.field in errors[0] and case.value in errors[0], errors[0]
    assert FIX.search(errors[0]), errors[0]
    assert _snapshot(root) == before


def test_corpus_size() -> None:
    """At least 60 distinct malformed inputs over the surfaces (the CLI's are in the bats corpus)."""
    surfaces = {c.surface for c in CASES}
    assert len({c.id for c in CASES}) == len(CASES) >= 60
    assert {"override", "model", "task", "trajectory", "nodefile"} <= surfaces


def test_the_resume_check_takes_what_a_crash_leaves(tmp_path: Path) -> None:
    """A torn last line (or one cut mid-character), an empty journal, another rank's files and a finished
    iteration's are no error: only what this rank will build on is read."""
    from coordinator.driver.resume import check_resume

    layout = Layout(tmp_path / "log")
    layout.state_dir(1).mkdir(parents=True)
    folder = layout.iteration_dir("train", 1)
    folder.mkdir(parents=True)
    (folder / "rank_0.jsonl").write_bytes((_GOOD_TRAJ + "\n").encode() + _GOOD_TRAJ.encode()[:40] + b"\xe2\x82")
    (folder / "rank_0.takeover_1.jsonl").write_bytes(b"")
    (folder / "rank_1.jsonl").write_text("[1, 2]\n")
    (folder / "rank_1.manifest.json").write_text("[]")
    check_resume(layout, rank=0)
    with pytest.raises(say.BadInput, match=re.escape("rank_1.jsonl:1 is not a baton.trajectory/1 line")):
        check_resume(layout, rank=1)
    layout.marker(1, "iteration").write_text("")
    check_resume(layout, rank=1)  # iteration 1 finished: --resume starts iteration 2


#: a task reasoning_gym takes
_RG_TASK = json.dumps(
    {"task_id": "t1", "task_name": "1 + 1 =", "metadata": {"dataset": "chain_sum", "entry": {"question": "1 + 1 ="}}}
).encode()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b'{"task_id": "t1", "task_name": "caf\xe9"}\n', "train.jsonl:1 is not UTF-8 text"),
        (b"", "env_config.train_tasks holds no tasks"),
        (_RG_TASK + b'\n{"task_id": "t2", ', "train.jsonl:2 is not valid JSON"),
        (_RG_TASK + b"\n" + _RG_TASK + b"\n", "train.jsonl:2 repeats task_id 't1'"),
        (b'{"task_id": "t1", "task_name": "add"}\n', "task 't1': reasoning_gym tasks need metadata.dataset"),
    ],
    ids=["not-utf-8", "empty", "truncated-line", "duplicate-ids", "refused-by-the-env"],
)
def test_compose_checks_the_task_files_a_run_rolls_out(tmp_path: Path, content: bytes, named: str) -> None:
    """run.sh's compose (coordinator.driver.run: the splits --rl-phase rolls out) checks each split's task file
    as its rollout would, before anything starts: one error naming the file (and line); an update-only run
    (no splits) needs none."""
    from coordinator.overrides import Request, route_and_compose

    data, log = tmp_path / "data", tmp_path / "log"
    _model(data / "model", json.dumps(MODEL_CONFIG))
    (data / "tasks").mkdir()
    (data / "tasks" / "train.jsonl").write_bytes(content)
    (data / "tasks" / "test.jsonl").write_bytes(_RG_TASK + b"\n")
    request = Request(str(data), str(log), str(data / "model"), [], rollout_splits=("train", "test"))
    with pytest.raises(ConfigError) as caught:
        route_and_compose(request)
    assert len(caught.value.problems) == 1 and named in caught.value.problems[0], caught.value.problems
    assert caught.value.problems[0].startswith("rollout_train: ") and str(data / "tasks") in caught.value.problems[0]
    request.rollout_splits = ("test",)
    route_and_compose(request)
    request.rollout_splits = ()
    route_and_compose(request)
    assert not log.exists()
