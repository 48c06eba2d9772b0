"""Every update path trains for real, is promoted, and is then served by vLLM with changed outputs.

On copies of one real train rollout of the default model (the session's `train_journal`), the update phase
(`python -m training`, train environment) runs two optimizer steps of each path (grpo one), four paths covering
every axis (CI time: one training each instead of one per combination):

- KTO (successful steps desirable, failed ones undesirable) under DeepSpeed ZeRO-2;
- DPO (a success and a failure of the same task) under DeepSpeed ZeRO-3;
- LoRA (RFT), merged into the base weights, trained by a 2-process torchrun on this one machine;
- GRPO (the policy-gradient loss in LLaMA-Factory's SFT trainer, training.pg_trainer) under DeepSpeed ZeRO-3, one
  optimizer step (its version carries Adam's moments, gathered from ZeRO-3's partitions), on a rollout of its own of
  a multi-turn environment (docs/examples/my_envs, guess the number, outside the repository): every episode of the
  tasks whose rewards differ is trained, failures too, each one row when its turns chain (data.episode_rows: every
  reply of it trained, the history once), and the tasks whose rewards do not are counted.

Each promoted policy is served by the module's one vLLM, and its greedy outputs must differ from the base
model's (the session's vLLM serves the base). That vLLM starts fresh on the first promoted policy (DPO's, whose
training output lacks the tied output head that promotion adds: `lm_head.safetensors`,
rollout_engine/checkpoint.py); the later ones are loaded into it in place (`PolicyServer.reload`, as the loop
serves a new policy). Last, that first policy reloaded in place must serve exactly what its fresh start served;
the server's process tree, its reuse by a second start on its port and its clean stop are checked there too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from coordinator import groupfile
from rollout_engine.checkpoint import HEAD, tensor_files
from rollout_engine.history import load_trajectories
from rollout_engine.layout import GROUPS_NAME
from rollout_engine.types import Failure
from tests.conftest import REPO
from tests.e2e.conftest import VllmServer, policy_server, run_update, start_vllm, stop_vllm
from tests.e2e.rollout_cli import rollout_cmd, run_rollout
from training.logprob_check import WARN_MEAN_GAP

pytestmark = pytest.mark.e2e

SMALL = [
    "algorithm.per_device_train_batch_size=2",
    "algorithm.gradient_accumulation_steps=1",
    "algorithm.learning_rate=1e-4",
    "algorithm.warmup_steps=0",
    "algorithm.cutoff_len=512",
]
#: in the order they run: the first two promote a training output without the tied head (ZeRO-2 saves it, the
#: others do not), which the module's vLLM starts fresh on
PATHS = {
    "dpo-zero3": ["algorithm=dpo", "launch.deepspeed=zero3"],
    # LoRA's B starts at zero: a larger step so that two of them move the greedy outputs
    "lora-2proc": ["algorithm.finetuning_type=lora", "algorithm.learning_rate=1e-3", "launch.nproc_per_node=2"],
    "kto-zero2": ["algorithm=kto", "launch.deepspeed=zero2"],
    "grpo-zero3": ["algorithm=grpo", "launch.deepspeed=zero3"],
}
#: the paths whose promotion adds the output head (the fresh start must be one of them)
HEADLESS = ("dpo-zero3", "lora-2proc")
#: optimizer steps of each path (2 unless said): grpo's one keeps the time it adds small
STEPS = {"grpo-zero3": 1}
#: what each path's generated LLaMA-Factory recipe must say
RECIPE = {
    "kto-zero2": {"stage": "kto", "finetuning_type": "full", "deepspeed": 2},
    "dpo-zero3": {"stage": "dpo", "finetuning_type": "full", "deepspeed": 3},
    "lora-2proc": {"stage": "sft", "finetuning_type": "lora", "deepspeed": None},
    "grpo-zero3": {"stage": "sft", "finetuning_type": "full", "deepspeed": 3},
}
#: each path's served outputs: {path: (its policy folder, kept in `promoted`; fingerprint)}
SERVED: dict[str, tuple[Path, list]] = {}


def fingerprint(server: VllmServer) -> list:
    """The greedy tokens and logprobs of the product's fixed probe (`coordinator fingerprint`)."""
    cmd = [sys.executable, "-m", "coordinator", "fingerprint", "--base-url", server.base_url, "--model", server.model]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@dataclass
class Served:
    """The module's vLLM (its weights are replaced), started on the first policy it serves."""

    run_dir: Path
    server: VllmServer | None = None
    #: the path whose policy it started on
    fresh: str | None = None

    def serve(self, path: str, policy: Path) -> list:
        """The fingerprint of `policy`: served by a fresh start the first time, loaded in place after."""
        if self.server is None:
            self.server, self.fresh = start_vllm(self.run_dir, policy), path
        else:
            assert self.server.server.reload(str(policy)), f"{path}: vLLM refused the in-place reload of {policy}"
        return fingerprint(self.server)


@pytest.fixture(scope="module")
def served(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, list]]:
    """The module's vLLM, and the base model's fingerprint (on the session's vLLM: one start fewer)."""
    module = Served(tmp_path_factory.mktemp("vllm-paths"))
    try:
        yield module, fingerprint(vllm_server)
    finally:
        if module.server is not None:
            stop_vllm(module.server)


@pytest.fixture(scope="module")
def guess_journal(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log path holding a real train rollout of guess-the-number (several turns, rewards that differ within a
    task: 1 for the first guess down to 0.5 for the last, 0 when none hit) by the default model."""
    root = tmp_path_factory.mktemp("guess")
    data, mine, log = root / "data", root / "elsewhere" / "my_envs", root / "log"
    shutil.copytree(REPO / "docs" / "examples" / "my_envs", mine)
    # 1..3 with the secret 2 or 3: the 135M model's first number is mostly 1 (in 1..8 it found none of 32), so
    # the episodes take several turns and end at different ones, or with none found
    tasks = [
        {"task_id": f"g-{i}", "task_name": "Guess a number from 1 to 3", "env": "guess", "family": "guess-1-3",
         "metadata": {"low": 1, "high": 3, "secret": 2 + i % 2}}
        for i in range(8)
    ]  # fmt: skip
    (data / "guess").mkdir(parents=True)
    (data / "guess" / "train.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    out = run_rollout(
        rollout_cmd(
            "rollout_train",
            data,
            log,
            vllm_server.base_url,
            "iteration=0",
            "env=custom",
            "env._target_=my_envs.guess.GuessNumberEnv",
            "+env.max_guesses=4",
            f"env_config.python_path=[{mine}]",
            "env_config.train_tasks=guess/train.jsonl",
            "env_config.train_tasks_rollout_size=8",
            "env_config.n_samples_per_task=4",
            # room for a reply to end by itself: one cut at the limit is never a success (the engine's rule)
            "policy_config.max_new_tokens=48",
            "policy_config.temperature=0.7",
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return log


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each path's promoted policy stays for the last test: a passed test's own folder goes as it ends."""
    return tmp_path_factory.mktemp("promoted")


@pytest.mark.parametrize("path", list(PATHS))
def test_update_path_trains_promotes_and_serves_changed_outputs(
    path: str, model_dir: Path, served: tuple[Served, list], promoted: Path, tmp_path: Path, request
) -> None:
    log = tmp_path / "log"
    journal = request.getfixturevalue("guess_journal" if path.startswith("grpo") else "train_journal")
    shutil.copytree(journal / "trajectories", log / "trajectories")
    steps = STEPS.get(path, 2)
    out = run_update(log, f"model_path={model_dir}", *SMALL, f"algorithm.max_steps={steps}", *PATHS[path])
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]

    run_dir = log / "training" / "iter_0000"
    recipe = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    want = RECIPE[path]
    assert (recipe["stage"], recipe["finetuning_type"]) == (want["stage"], want["finetuning_type"])
    ds = recipe.get("deepspeed")  # the preset's config (a ZeRO stage), fp32 on the CPU: no torch_autocast
    assert (ds["zero_optimization"]["stage"] if ds else None) == want["deepspeed"] and "torch_autocast" not in (
        ds or {}
    )
    metrics = [json.loads(line) for line in (log / "metrics" / "update.jsonl").read_text().splitlines()]
    training = next(m for m in metrics if m.get("kind") == "training")
    assert training["steps"] == steps and len(training["losses"]) == steps, training
    if path.startswith("dpo"):  # pairs: a chosen and a rejected reply of one task
        rows = json.loads((run_dir / "data" / "train.json").read_text())
        assert rows and all(row["chosen"]["value"] != row["rejected"]["value"] for row in rows)
    if path.startswith("kto"):  # both kinds of example
        tags = {row["kto_tag"] for row in json.loads((run_dir / "data" / "train.json").read_text())}
        assert tags == {True, False}
    if path.startswith("lora"):
        assert (run_dir / "merged" / "model.safetensors").exists(), "the LoRA is merged before promotion"
    if path.startswith("grpo"):
        check_grpo(log, run_dir, recipe, training)
        # Adam's moments gathered from ZeRO-3's partitions, saved with the version the next update starts from: every
        # one of the model's 272 named tensors
        carried = json.loads((log / "policy" / "v0001" / "optimizer" / "state.json").read_text())
        assert (carried["optimizer_steps"], carried["moments"], carried["parameters"]) == (steps, True, 272), carried

    policy = log / "policy" / "v0001"
    record = json.loads((policy / "baton_policy.json").read_text())
    assert record["version"] == 1 and record["finetuning_type"] == want["finetuning_type"]
    assert HEAD in tensor_files(policy), "a promoted policy carries its tied output head (an exact reload)"

    module, base = served
    shutil.copytree(policy, promoted / path, copy_function=os.link)  # hard links: no second copy on disk
    now = module.serve(path, promoted / path)
    assert now != base, f"{path}: the promoted policy serves the base model's greedy outputs"
    SERVED[path] = (promoted / path, now)


def check_grpo(log: Path, run_dir: Path, recipe: dict, training: dict) -> None:
    """Every episode of each task whose rewards differ is one row with its advantage (failures negative), the
    tasks whose rewards are all equal are dropped and counted, and the loss is the policy-gradient one."""
    assert recipe["baton_policy_gradient"] == {
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token_mean",
        "kl_beta": 0.0,
        "old_logprobs": "rollout",
        "tis_cap": 2.0,
    }
    rewards: dict[str, list[float]] = {}
    turns: dict[str, int] = {}
    for episode in load_trajectories(str(log), "train", range(1)):
        if episode.status is Failure.OK and episode.turns:
            rewards.setdefault(episode.task_id, []).append(episode.reward)
            turns[episode.episode_id] = len(episode.turns)
    differ = [r for r in rewards.values() if len(set(r)) > 1]
    selection = json.loads((run_dir / "selection.json").read_text())
    filtered = selection["filtered"]
    assert filtered["same_reward_groups"] == len(rewards) - len(differ), (filtered, len(rewards))
    assert differ, f"no task's rewards differ: {rewards}"
    assert (training["train_rows"], training["same_reward_groups"]) == (
        selection["train_rows"],
        len(rewards) - len(differ),
    )
    assert len(training["pg"]["ratio"]) == len(training["pg"]["clipped_high"]) == 1 and "kl" not in training["pg"]
    rows = [json.loads(line) for line in (run_dir / "data" / "train.token_ids.jsonl").read_text().splitlines()]
    assert min(row["advantage"] for row in rows) < 0 < max(row["advantage"] for row in rows)
    # one row per episode where its turns chain (the default model's ChatML history does): every turn of it, in
    # order, the whole history once; the others per turn (selection.json says why)
    assert selection["rows"]["episode_rows"] and recipe["mask_history"] is False, selection["rows"]
    episodes = [row for row in rows if "turns" in row]
    assert episodes, selection["rows"]
    for row in episodes:
        episode_id = row["source"].rsplit("@", 1)[0]
        assert row["source"] == f"{episode_id}@0..{turns[episode_id] - 1}"
        assert len(row["turns"]) == turns[episode_id] > 1
    left_out = filtered.get("noncanonical_tokens", 0) + filtered.get("over_cutoff", 0)
    trained = sum(len(row.get("turns", [row])) for row in rows)
    assert trained + left_out >= sum(turns[e] for e in {r["source"].rsplit("@", 1)[0] for r in episodes})
    train_log = (run_dir / "train.log").read_text()
    assert "grpo: the policy-gradient loss with" in train_log and "pg_clipped_high" in train_log
    # the rollout recorded the behaviour policy's log-probability of every sampled token (return_logprobs), and
    # the trainer's, before its one step moved the weights, are vLLM's up to numerics: the mean ratio is 1
    for turn in (turn for row in rows for turn in row.get("turns", [row])):
        assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"])
    assert "rows have no behaviour log-probabilities" not in train_log
    assert abs(training["pg"]["ratio"][0] - 1.0) < 0.02, training["pg"]
    # the same comparison token by token, free in the trainer's first step: numerics alone (the session's vLLM
    # serves bf16 on a CPU with native bf16, the trainer computes fp32: ~0.03, docs/update.md)
    assert 0 < training["pg"]["logprob_gap"][0] < WARN_MEAN_GAP, training["pg"]


def test_a_reloaded_policy_serves_what_a_fresh_server_serves(
    served: tuple[Served, list], capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-place reload must serve the promoted weights exactly, output head included: the policy the module's
    vLLM started on, reloaded into it after the others, serves what its fresh start served. That server runs an
    API server and an engine process; a second start on its port (a later run on this run directory) reuses it
    instead of racing it; its stop leaves no process behind."""
    module, _ = served
    assert module.server is not None, "no path promoted a policy above (their failures say why)"
    path, server = module.fresh, module.server
    assert path in HEADLESS, f"the first path served ({path}) promoted a training output that had its head"
    policy, fresh = SERVED[path]
    try:
        assert server.server.reload(str(policy)), f"vLLM refused the in-place reload of {policy}"
        reloaded = fingerprint(server)
        pgid = server.pgid()
        started = _descendants(pgid)
        assert len(started) >= 2, "vLLM runs an API server and an engine process"
        capsys.readouterr()
        policy_server(server.run_dir, server.port, server.model).start(str(policy), deadline_s=60)
        assert "reusing it" in capsys.readouterr().err
        assert server.pgid() == pgid, "the recorded server was restarted instead of reused"
    finally:
        stop_vllm(server)
        module.server = None
    assert reloaded == fresh, f"{path}: reloaded in place {reloaded} != served by a fresh start {fresh}"
    left = [pid for pid in started if _alive(pid)]
    assert left == [], f"processes left after PolicyServer.stop: {left}"
    assert "vllm" not in groupfile.read(server.run_dir / GROUPS_NAME)


def _descendants(root: int) -> set[int]:
    """Every live process whose parent chain reaches `root` (plus root)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return {pid for pid in found if Path(f"/proc/{pid}").exists()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
