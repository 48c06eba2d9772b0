"""The update phase's steps: prepare -> train -> promote (`run_update` runs the configured ones),
and `phase=check`, which asks LLaMA-Factory about the config and stops (run.sh, before the first rollout).

Everything of one update lives in `<log>/training/iter_<NNNN>/`:

    config.yaml          the resolved Hydra config
    selection.json       counts: trajectories, samples, what each rule filtered
    data/                the LLaMA-Factory dataset (training.dataset)
    train_config.yaml    the LLaMA-Factory YAML (training.recipe)
    dataset.sha256       the sha256 of data/ and that YAML (every node of a multi-node update checks it)
    train.log            llamafactory-cli's output
    output/              its output directory (merged/ for a LoRA)
    tensorboard/, wandb/ its training curves, with tracker=tensorboard / wandb (report_to)

Bad input raises `ConfigError` before anything is written or launched (its
subclass `NothingToTrain` when the data cannot fill one optimizer step); a
failed training raises `TrainingError` and leaves `policy/current` untouched,
and running the same command again retries.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from rollout_engine.errors import BatonError, ConfigError
from rollout_engine.exits import Exit
from rollout_engine.files import save_json, save_text
from rollout_engine.history import load_trajectories
from rollout_engine.layout import Layout, iteration_name, iterations
from rollout_engine.metrics_log import append_update
from training import config as config_mod
from training import sigkill
from training.carry import OPTIMIZER_FOLDER
from training.config import UpdateConfig
from training.dataset import DatasetFiles, dataset_digest, drop_rows, save_dataset
from training.demonstrations import add_demonstrations, demonstrations_for
from training.episodes import plan_rows
from training.launch import TrainResult, run_group, run_training
from training.metrics import parse_training, policy_gradient_stats
from training.precision import parameter_count, promotion_dtype, training_weights, weights_dtype
from training.promotion import promote, revert
from training.recipe import (
    Device,
    build_recipe,
    check_deepspeed,
    load_template,
    named_key,
    parse_recipe,
    rejection,
    save_recipe,
    tracker_env,
)
from training.selection import Selection, bound_images
from training.space import Room

if TYPE_CHECKING:
    from training.chat_template import Choice

log = logging.getLogger(__name__)


class TrainingError(BatonError):
    """llamafactory-cli failed or timed out; the current policy is unchanged."""


class NothingToTrain(ConfigError):
    """Too little data for one optimizer step (no trajectories, no usable sample, a batch not filled):
    not a failure of the loop, which keeps the served policy and goes on (exit 3)."""


@dataclass(frozen=True)
class RunPaths:
    """The files of one update (see the module docstring)."""

    run_dir: Path

    @classmethod
    def of(cls, cfg: UpdateConfig) -> RunPaths:
        return cls(Layout(cfg.log_path).training_dir(cfg.iteration))

    data = property(lambda self: self.run_dir / "data")
    recipe = property(lambda self: self.run_dir / "train_config.yaml")
    output = property(lambda self: self.run_dir / "output")
    merged = property(lambda self: self.run_dir / "merged")
    train_log = property(lambda self: self.run_dir / "train.log")
    digest = property(lambda self: self.run_dir / "dataset.sha256")
    #: LLaMA-Factory's tracker outputs (tracker=tensorboard / wandb)
    tensorboard = property(lambda self: self.run_dir / "tensorboard")
    wandb = property(lambda self: self.run_dir / "wandb")

    def node_log(self, node_rank: int) -> Path:
        """llamafactory-cli's output on one node: train.log on node 0, train.rank_<r>.log on the others."""
        return self.train_log if node_rank == 0 else self.run_dir / f"train.rank_{node_rank}.log"


@dataclass(frozen=True)
class InProcess:
    """The update runs inside the warm trainer's workers (training/warm.py): rank `rank` of `world`, training
    through `trainer` (recipe, log, env) -> TrainResult, `share(code)` giving rank 0's code to all ranks, and
    merging a LoRA through `export` (export YAML, log) -> exit code."""

    rank: int
    world: int
    trainer: Callable[[Path, Path, dict[str, str]], TrainResult]
    share: Callable[[int], int]
    export: Callable[[Path, Path], int] | None = None


_in_process: InProcess | None = None


@contextmanager
def in_process(rank: int, world: int, trainer, share, export=None) -> Iterator[None]:
    """Run updates in this process for the block (the warm trainer's jobs)."""
    global _in_process
    _in_process = InProcess(rank, world, trainer, share, export)
    try:
        yield
    finally:
        _in_process = None


def run_update(cfg: UpdateConfig, device: Device) -> None:
    """Run the phases `cfg.phase` names on this node's `device` (training.launch.hidden_gpus). In the warm
    trainer, rank 0 alone prepares and promotes; every rank trains."""
    paths = RunPaths.of(cfg)
    lead = _in_process is None or _in_process.rank == 0
    if cfg.phase == "check" and lead:
        check(cfg, paths, device)
    if cfg.phase in ("prepare", "all"):
        _on_lead(lambda: prepare(cfg, paths, device))
    if cfg.phase in ("train", "all"):
        train(cfg, paths, device)
    if cfg.phase in ("promote", "all") and cfg.launch.node_rank == 0:
        _on_lead(lambda: promote_policy(cfg, paths))
    if cfg.phase == "revert" and lead:
        revert_policy(cfg)


#: what each exception of a lead rank's step is on the other ranks (they raise the same, without its message)
_SHARED = {0: None, Exit.NOTHING_TO_TRAIN: NothingToTrain, Exit.BAD_INPUT: ConfigError, Exit.FAILED: TrainingError}


def _on_lead(step: Callable[[], object]) -> None:
    """`step()` on rank 0 only, in the warm trainer; its outcome reaches every rank, so that all of them go on
    to train, or all stop with the same exit."""
    if _in_process is None or _in_process.world == 1:
        step()
        return
    if _in_process.rank == 0:
        code = 0
        try:
            step()
        except NothingToTrain:
            code = Exit.NOTHING_TO_TRAIN
            raise
        except ConfigError:
            code = Exit.BAD_INPUT
            raise
        except BaseException:
            code = Exit.FAILED
            raise
        finally:
            _in_process.share(code)
        return
    error = _SHARED.get(_in_process.share(0), TrainingError)
    if error is not None:
        raise error("rank 0 stopped this update (its log says why)")


def recipe_of(cfg: UpdateConfig, paths: RunPaths, files: DatasetFiles, device: Device) -> dict:
    """The LLaMA-Factory YAML of this update (what prepare writes and phase=check asks about), training from
    the model's full-precision weights when it is a policy version that kept them (training.precision), with
    the template that renders its chat template (training.chat_template)."""
    version = config_mod.model_path(cfg).resolve()
    model = training_weights(version)
    return build_recipe(cfg, files, model, paths.output, device, template_of(cfg, model), version)


def template_of(cfg: UpdateConfig, model: Path) -> Choice:
    """The LLaMA-Factory template (and default system prompt) of `model`'s rows; ConfigError when none fits."""
    from training.chat_template import Encoding, Wanted, choose_template

    m = cfg.model_config
    wanted = Wanted(m.template, m.default_system, json.dumps(dict(m.chat_template_kwargs), sort_keys=True))
    return choose_template(model, wanted, Encoding(cfg.algorithm.stage, cfg.algorithm.mask_history))


def check(cfg: UpdateConfig, paths: RunPaths, device: Device) -> None:
    """phase=check: LLaMA-Factory reads the YAML this node's update would write (its template, argument
    parser and tokenizer) and the DeepSpeed preset is there; writes nothing, launches nothing. The GPU
    stays untouched (parse_recipe reads as one CPU process): vLLM may be measuring its free memory beside
    this check."""
    if importlib.util.find_spec("llamafactory") is None:
        raise ConfigError("phase=check needs LLaMA-Factory: run it with the train environment's $BATON_TRAIN_PY")
    files = DatasetFiles(paths.data, train_rows=1, val_rows=int(cfg.data.val_split_ratio > 0))
    recipe: dict = {}
    problems = check_deepspeed(cfg.launch.deepspeed, device)
    try:
        recipe = recipe_of(cfg, paths, files, device)
        load_template(parse_recipe(recipe))
    except ConfigError as exc:
        problems.extend(exc.problems)
    except (OSError, ValueError) as exc:  # the tokenizer's files: missing, or none transformers can load
        problems.append(rejection(exc, recipe))
    if problems:
        raise ConfigError(problems)
    chosen = template_of(cfg, training_weights(config_mod.model_path(cfg).resolve()))
    # the driver shows this line (its dry run and its start): keep its prefix
    log.info("chat template: %s (found from the model's chat template)", chosen.describe())
    log.info("check: LLaMA-Factory accepts this config (stage %s, %s)", cfg.algorithm.stage, device.kind)


def prepare(cfg: UpdateConfig, paths: RunPaths, device: Device) -> None:
    """Select samples, write and check the dataset (in a staging folder), then the YAML."""
    selection = select(cfg)
    check_batch(cfg, len(selection.samples), selection.describe(), device)
    staging = paths.run_dir / ".data-staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        # one row per episode where its turns chain; with mask_history false every reply trains already, per turn
        plan = plan_rows(
            selection.samples,
            cfg.algorithm.stage,
            cfg.data.episode_rows if cfg.algorithm.mask_history else "per_turn",
            masks_labels=cfg.algorithm.policy_gradient is not None,  # grpo trains each row's sampled tokens only
        )
        log.info("rows: %s", plan.describe())
        files = save_dataset(
            plan,
            staging,
            cfg.algorithm.stage,
            cfg.data.val_split_ratio,
            cfg.algorithm.selection.seed + cfg.iteration,
        )
        recipe = recipe_of(cfg, paths, files, device)
        check_tokens(cfg, files, recipe, selection)
        if cfg.data.logprob_samples and files.train_rows:
            from training.logprob_check import check_recipe

            check_recipe(recipe, cfg.data.logprob_samples, cfg.algorithm.selection.seed)
        check_batch(cfg, files.train_rows + files.val_rows, selection.describe(), device)
        shutil.rmtree(paths.data, ignore_errors=True)
        staging.rename(paths.data)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.directory = paths.data
    recipe = recipe_of(cfg, paths, files, device)
    save_recipe(paths.recipe, recipe)
    if "torch_autocast" in (recipe.get("deepspeed") or {}):
        log.info(
            "DeepSpeed computes in bf16 through its torch_autocast on fp32 parameters, which the trainer saves "
            "(LLaMA-Factory's `bf16` is off: its log says `compute dtype: None`)"
        )
    save_text(paths.digest, dataset_digest(paths.data, paths.recipe) + "\n")
    save_text(paths.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    save_json(
        paths.run_dir / "selection.json",
        {
            "iteration": cfg.iteration,
            "trajectories": selection.trajectories,
            "samples": len(selection.samples),
            "demonstrations": selection.demonstrations,
            "train_rows": files.train_rows,
            "val_rows": files.val_rows,
            "filtered": selection.filtered,
            "rows": plan.record(),
        },
    )
    log.info("prepared %s: %s", paths.data, selection.describe())


def check_tokens(cfg: UpdateConfig, files: DatasetFiles, recipe: dict, selection: Selection) -> None:
    """Token fidelity on each split; drop (or fail on) replies LLaMA-Factory would re-tokenize."""
    if cfg.data.fidelity_samples == 0:
        parse_recipe(recipe)  # still: a setting LLaMA-Factory refuses stops here (exit 2), not in the trainer
        return
    from training.fidelity import check_fidelity

    # grpo: every row, since each row's advantage and log-probabilities go onto exactly the sampled tokens
    samples = -1 if cfg.algorithm.policy_gradient is not None else cfg.data.fidelity_samples
    for split, rows in (("train", files.train_rows), ("val", files.val_rows)):
        if not rows:
            continue
        report = check_fidelity(recipe, samples, cfg.algorithm.selection.seed, split)
        if report.noncanonical and cfg.data.noncanonical == "fail":
            raise ConfigError(
                f"token fidelity: {len(report.noncanonical)} {split} rows (first: row "
                f"{report.noncanonical[0]}) re-tokenize differently from the sampled ids; "
                "set data.noncanonical=drop to train without them"
            )
        if report.noncanonical:
            drop_rows(files, split, report.noncanonical)
            selection.filtered["noncanonical_tokens"] = selection.filtered.get("noncanonical_tokens", 0) + len(
                report.noncanonical
            )


def select(cfg: UpdateConfig) -> Selection:
    """Load the journals of the window and run the configured selector."""
    from hydra.utils import instantiate

    sel = cfg.algorithm.selection
    window = range(cfg.iteration - sel.last_k_iterations + 1, cfg.iteration + 1)
    trajectories = load_trajectories(cfg.log_path, "train", window)
    demonstrations = demonstrations_for(cfg)
    if not trajectories and not demonstrations:
        dirs = f"{Layout(cfg.log_path).iteration_dir('train', window.start)} .. {iteration_name(cfg.iteration)}"
        raise NothingToTrain(
            f"no train trajectories in {dirs} (log_path={cfg.log_path}, iteration={cfg.iteration}); "
            "run the rollout first or fix log_path / iteration"
        )
    selector = instantiate(OmegaConf.structured(sel))
    selection = selector.select(trajectories, cfg.iteration, cfg.algorithm.cutoff_len)
    if demonstrations:
        add_demonstrations(
            selection,
            demonstrations,
            selector,
            cfg.iteration,
            cfg.algorithm.cutoff_len,
            cfg.data.demonstration_samples,
            cfg.algorithm.stage,
        )
    bound_images(selection, cfg.data.max_images_per_sample)
    if not selection.samples:
        raise NothingToTrain(f"no usable samples for algorithm {cfg.algorithm.name}: {selection.describe()}")
    if cfg.algorithm.stage == "kto" and len({s.label for s in selection.samples}) < 2:
        kind = "desirable" if selection.samples[0].label else "undesirable"
        raise NothingToTrain(
            f"kto needs desirable and undesirable samples, all {len(selection.samples)} are {kind}: "
            f"{selection.describe()}"
        )
    return selection


def check_batch(cfg: UpdateConfig, samples: int, described: str, device: Device) -> None:
    """One optimizer step must be fillable from the training rows."""
    alg, launch = cfg.algorithm, cfg.launch
    procs = (launch.nproc_per_node or device.count) * launch.nnodes
    global_batch = alg.per_device_train_batch_size * alg.gradient_accumulation_steps * procs
    train_rows = samples - int(samples * cfg.data.val_split_ratio)
    if train_rows < global_batch:
        raise NothingToTrain(
            f"{train_rows} training rows cannot fill one optimizer step of algorithm.per_device_train_batch_size="
            f"{alg.per_device_train_batch_size} x algorithm.gradient_accumulation_steps="
            f"{alg.gradient_accumulation_steps} x {procs} processes = {global_batch}; lower them or collect more "
            f"samples ({described})"
        )


def train(cfg: UpdateConfig, paths: RunPaths, device: Device) -> None:
    """Run llamafactory-cli on the prepared YAML; its record to <log>/metrics/update.jsonl (metrics_log)."""
    if not paths.recipe.exists() and not cfg.launch.dataset_sha256:
        raise ConfigError(f"{paths.recipe} does not exist; run phase=prepare first")
    if cfg.launch.dataset_sha256:
        wait_for_dataset(paths, cfg.launch.dataset_sha256, cfg.launch.dataset_wait_s)
    if cfg.launch.node_rank == 0 or _in_process is not None:  # in the warm trainer every rank joins rank 0's step
        _on_lead(lambda: make_room(cfg, paths))
    node_log = paths.node_log(cfg.launch.node_rank)
    if _in_process is not None:
        result = _in_process.trainer(paths.recipe, node_log, tracker_env(cfg, paths.run_dir))
    else:
        result = run_training(paths.recipe, node_log, cfg.launch, device, tracker_env(cfg, paths.run_dir))
    if result.returncode != 0 or result.timed_out:
        why = f"timed out after {cfg.launch.timeout_s:.0f} s" if result.timed_out else f"exit {result.returncode}"
        if not result.timed_out and killed_by_sigkill(result.returncode, node_log):
            why += f" ({SIGKILL_HINT})"
        elif not result.timed_out and (refused := refusal(node_log, paths.recipe)):
            # a setting the trainer refuses fails every retry alike: bad input (exit 2), the run stops
            raise ConfigError(f"{refused}\n  (the training stopped with exit {result.returncode}; see {node_log})")
        if said := last_error(node_log):
            why += f", its last error: {said}"
        if (room := room_for(cfg, paths)) is not None and not room.enough:
            why += f"; {room.describe()}: a full disk stops the training, often before it can log why"
        raise TrainingError(
            f"training {why}; see {node_log}. policy/current is unchanged; run the same command again to retry"
        )
    if cfg.launch.node_rank == 0 and (_in_process is None or _in_process.rank == 0):
        stats = parse_training(paths.output, paths.train_log)
        if cfg.algorithm.policy_gradient is not None:
            stats |= policy_gradient_record(paths)
        append_update(
            cfg.log_path,
            {
                "kind": "training",
                "iteration": cfg.iteration,
                "time": time.time(),
                "algorithm": cfg.algorithm.name,
                "wall_s": round(result.wall_s, 2),
                "trainer": "fresh" if _in_process is None else f"warm:{os.getpid()}",
                **stats,
            },
        )
        log.info("trained in %.1f s: %s", result.wall_s, stats)


def policy_gradient_record(paths: RunPaths) -> dict:
    """grpo's part of the training record: the rows, the groups dropped for equal rewards (selection.json), and
    the per-step clip shares, ratio and KL (`pg`: training.metrics.policy_gradient_stats)."""
    try:
        selection = json.loads((paths.run_dir / "selection.json").read_text())
    except (OSError, ValueError):
        selection = {}
    return {
        "train_rows": selection.get("train_rows"),
        "same_reward_groups": selection.get("filtered", {}).get("same_reward_groups"),
        "pg": policy_gradient_stats(paths.output),
    }


def clear_outputs(paths: RunPaths) -> None:
    """Never write into files a policy may hard-link; a retried training's curves replace the last try's."""
    for folder in (paths.output, paths.tensorboard, paths.wandb):
        shutil.rmtree(folder, ignore_errors=True)


def clear_earlier_outputs(paths: RunPaths, iteration: int) -> None:
    """Remove what earlier iterations' trainings wrote in output/ (merged/ for a LoRA): weights and optimizer
    states nothing reads again (a --resume redoes only the interrupted iteration, whose outputs its retry clears;
    the records hold the losses). A promoted version has its own hard links (or copies) of them, so without this
    a version pruned by promotion.keep_last kept its space; an update that failed or was killed (while it saved:
    a half-written optimizer state) left its output for good, and on a tight disk every later update was refused.
    The iterations' logs, selection and curves stay."""
    for number, run_dir in iterations(paths.run_dir.parent):
        if number >= iteration:
            continue
        for folder in (run_dir / "output", run_dir / "merged"):
            if folder.is_dir():
                log.info("removing %s: an earlier training's output (a promoted version has its own links)", folder)
                shutil.rmtree(folder, ignore_errors=True)


def make_room(cfg: UpdateConfig, paths: RunPaths) -> None:
    """Clear the last try's outputs and the earlier trainings', then refuse to start a training whose weights would
    not fit on the disk."""
    clear_outputs(paths)
    clear_earlier_outputs(paths, cfg.iteration)
    room = room_for(cfg, paths)
    if room is not None and not room.enough:
        raise TrainingError(
            f"{room.describe()}: free space there, then run the same command again (nothing was trained; "
            "promotion.keep_last prunes older policy versions after each promotion)"
        )


def room_for(cfg: UpdateConfig, paths: RunPaths) -> Room | None:
    weights = parameter_count(training_weights(config_mod.model_path(cfg).resolve()))
    alg = cfg.algorithm
    moments = alg.carry_optimizer and alg.finetuning_type in ("full", "freeze")
    return Room.of(paths.run_dir, weights, moments)


SIGKILL_HINT = sigkill.HINT

#: torchrun prefixes a worker's lines with [rankN]: (or [defaultN]:)
WORKER_PREFIX = r"^(?:\[(?:rank|default)\d+\]:\s*)?"
#: the last line of a Python traceback
ERROR_LINE = re.compile(WORKER_PREFIX + r"([A-Za-z_][\w.]*(?:Error|Exception)\b.*)$", re.M)
#: the last line of a Python traceback that refuses a value
REFUSED_LINE = re.compile(WORKER_PREFIX + r"((?:ValueError|TypeError|AssertionError): .*)$", re.M)


def log_tail(node_log: Path, size: int = 50000) -> str | None:
    """The last `size` bytes of a training's log (None: unreadable)."""
    try:
        return node_log.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return None


def last_error(node_log: Path) -> str | None:
    """The last exception a failed training logged, if it logged one."""
    said = ERROR_LINE.findall(log_tail(node_log) or "")
    return said[-1].strip()[:300] if said else None


def refusal(node_log: Path, recipe_path: Path) -> str | None:
    """A failed training's refusal of a setting, worded as phase=check words one (`rejection`): the log's last
    ValueError / TypeError / AssertionError whose message names a key or a string value of the training YAML
    (`Invalid learning rate: -1.0` names learning_rate). None for any other failure: a retry may pass."""
    tail = log_tail(node_log)
    try:
        recipe = OmegaConf.to_container(OmegaConf.load(recipe_path))
    except Exception:  # an unreadable YAML: no refusal to name (the failure stays a failure)
        return None
    said = [m.group(1).strip() for m in REFUSED_LINE.finditer(tail or "")]
    if not said or not isinstance(recipe, dict) or named_key(said[-1], recipe) is None:
        return None
    return rejection(said[-1], recipe)


def killed_by_sigkill(returncode: int, node_log: Path) -> bool:
    """The training ended by a SIGKILL: its own exit (-9, or 137 from a shell), or torchrun's report of a
    worker's (`Signal 9 (SIGKILL)`, `exitcode  : -9`) in the node's log."""
    if returncode in (-9, 137):
        return True
    return sigkill.reported(log_tail(node_log, 20000) or "")


def wait_for_dataset(paths: RunPaths, expected: str, wait_s: float, every_s: float = 1.0) -> None:
    """Train only on the dataset the master prepared: its files and YAML must have the sha256 it published.
    A shared filesystem may show them late (NFS attribute caching): look again every `every_s` for `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            got = dataset_digest(paths.data, paths.recipe)
        except OSError as exc:
            got = f"unreadable ({exc})"
        if got == expected:
            log.info("the dataset is the one the master prepared (sha256 %s)", expected)
            return
        if time.monotonic() >= deadline:
            raise TrainingError(
                f"the dataset under {paths.run_dir} (data/ and {paths.recipe.name}) has sha256 {got} on this node "
                f"after {wait_s:.0f} s, but the master prepared {expected}: this node does not see the master's "
                "files. Check that the log path is the same shared directory on every node and its mount options "
                "(docs/multinode.md), then start every node again with --resume"
            )
        time.sleep(every_s)


def promote_policy(cfg: UpdateConfig, paths: RunPaths) -> int:
    """Merge a LoRA if needed, then promote the weights as the next policy version."""
    if not (paths.output / "config.json").exists() and not (paths.output / "adapter_config.json").exists():
        raise ConfigError(f"{paths.output} holds no trained model; run phase=train first")
    source = paths.output
    if cfg.algorithm.finetuning_type == "lora":
        source = merge_lora(cfg, paths)
    parent = config_mod.model_path(cfg).resolve()
    version = promote(
        source,
        Layout(cfg.log_path).policy,
        cfg.iteration,
        parent,
        cfg.promotion.keep_last,
        cfg.algorithm.finetuning_type,
        paths.output / OPTIMIZER_FOLDER,
        promotion_dtype(cfg.promotion.dtype, weights_dtype(parent), cfg.promotion.served_dtype),
    )
    append_update(
        cfg.log_path,
        {"kind": "promotion", "iteration": cfg.iteration, "time": time.time(), "policy_version": version},
    )
    return version


def revert_policy(cfg: UpdateConfig) -> int:
    """phase=revert (run.sh --keep-best): model_path's weights as the next version; a `kind: revert` record."""
    why = {
        "rule": "--keep-best",
        "replaced": cfg.revert.replaced,
        "replaced_success_rate": cfg.revert.replaced_success_rate,
        "best_success_rate": cfg.revert.best_success_rate,
        "margin_points": cfg.revert.margin_points,
    }
    source = config_mod.model_path(cfg).resolve()
    policy_root = Layout(cfg.log_path).policy
    version = revert(source, policy_root, cfg.iteration, cfg.revert.to_version, why, cfg.promotion.keep_last)
    append_update(
        cfg.log_path,
        {
            "kind": "revert",
            "iteration": cfg.iteration,
            "time": time.time(),
            "policy_version": version,
            "reverted_to": cfg.revert.to_version,
            **{k: v for k, v in why.items() if k != "rule"},
        },
    )
    return version


def merge_lora(cfg: UpdateConfig, paths: RunPaths) -> Path:
    """`llamafactory-cli export` (in the warm trainer: its export function, in-process, on the CPU as the command
    runs it): base model + adapter -> a full HF folder."""
    from training.launch import cli_command, launch_env

    export = {
        "model_name_or_path": str(training_weights(config_mod.model_path(cfg).resolve())),
        "adapter_name_or_path": str(paths.output),
        "template": OmegaConf.load(paths.recipe).template,  # the template the adapter trained with
        "finetuning_type": "lora",
        "export_dir": str(paths.merged),
        "trust_remote_code": True,
        "infer_dtype": "float32",  # merged at full precision: promotion serves the base dtype and keeps this
    }
    export_yaml = paths.run_dir / "merge_config.yaml"
    save_recipe(export_yaml, export)
    shutil.rmtree(paths.merged, ignore_errors=True)
    merge_log, started = paths.run_dir / "merge.log", time.monotonic()
    here = _in_process is not None and _in_process.export is not None  # the warm trainer: no process to start
    if here:
        code = _in_process.export(export_yaml, merge_log)
    else:
        code = run_group(
            [*cli_command(), "export", str(export_yaml)],
            merge_log,
            launch_env(cfg.launch, Device("cpu", 1)),
            cfg.launch.timeout_s,
            cfg.launch.grace_s,
        ).returncode
    if code != 0:
        raise TrainingError(f"merging the LoRA failed (exit {code}); see {merge_log}")
    how = "in this process" if here else "by llamafactory-cli export"
    log.info("the LoRA merged %s in %.1f s (%s)", how, time.monotonic() - started, paths.merged)
    return paths.merged


def describe_config(cfg: UpdateConfig) -> str:
    """One log line with what will run."""
    return (
        f"update: iteration {cfg.iteration}, algorithm {cfg.algorithm.name} ({cfg.algorithm.stage}, "
        f"{cfg.algorithm.finetuning_type}), model {config_mod.model_path(cfg)}, phase {cfg.phase}"
    )
