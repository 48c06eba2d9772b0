"""Structured config of the update phase (`python -m training --config-name update`).

The dataclasses below are the schema; `register_configs()` stores them in
Hydra's ConfigStore (called by the entry point, never at import), and the YAML
under configs/ (update.yaml, algorithm/*.yaml, ...) only sets values. Single
fields are checked in `__post_init__`; `validate` checks fields against each
other and collects every problem into one `ConfigError`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout
from training.demonstration_files import check_demonstrations

STAGES = ("sft", "kto", "dpo")
FINETUNING_TYPES = ("full", "lora")
PHASES = ("prepare", "train", "promote", "all", "check", "revert")
PROMOTION_DTYPES = ("auto", "bfloat16", "float16", "float32")
DEEPSPEED_PRESETS = ("auto", "none", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload")


@dataclass
class SelectionConfig:
    """Which samples to train on. `_target_` picks the selector class (training.selection)."""

    _target_: str = MISSING
    #: use the train journals of this many most recent iterations (<= the current one)
    last_k_iterations: int = 4
    #: keep only tasks whose samples disagree (some succeed, some fail)
    disagreement_filter: bool = False
    #: skip steps after which the environment state did not change
    skip_unchanged_steps: bool = True
    #: seed of the draw (the iteration number is added, so each iteration draws anew)
    seed: int = 0


@dataclass
class RFTSelectionConfig(SelectionConfig):
    """Filtered behaviour cloning: steps of successful trajectories (WebGym's recipe)."""

    _target_: str = "training.selection.RFTSelector"
    #: how many steps to draw (all when fewer exist)
    positive_samples_to_train: int = 1800
    #: a step of iteration i (oldest used = 1) is drawn with weight i**power; 0 = uniform
    recency_bias_power: float = 2.0
    #: at most this many successes per task and iteration, the shortest replies first (0 = all; against length drift,
    #: docs/benchmarks.md 3c)
    shortest_per_task: int = 1


@dataclass
class KTOSelectionConfig(SelectionConfig):
    """Desirable = steps of successful trajectories, undesirable = steps of failed ones."""

    _target_: str = "training.selection.KTOSelector"
    #: at most this many samples (0 = all), drawn uniformly
    max_samples: int = 0


@dataclass
class DPOSelectionConfig(SelectionConfig):
    """Pairs of a successful and a failed sample of the same task (first steps share the prompt)."""

    _target_: str = "training.selection.DPOSelector"
    #: pairs per task at most
    max_pairs_per_task: int = 4
    #: at most this many pairs in all (0 = all)
    max_pairs: int = 0


@dataclass
class AlgorithmConfig:
    """Sample selection plus every LLaMA-Factory hyperparameter WebGym exposes."""

    name: str = MISSING
    #: LLaMA-Factory stage: sft (rft), kto or dpo
    stage: str = "sft"
    selection: Any = MISSING
    finetuning_type: str = "full"
    cutoff_len: int = 2048
    per_device_train_batch_size: int = 1
    per_device_eval_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant_with_warmup"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    num_train_epochs: float = 1.0
    #: > 0 stops after this many optimizer steps
    max_steps: int = -1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    #: null = bf16 on GPU, fp32 on CPU
    bf16: bool | None = None
    gradient_checkpointing: bool = False
    save_only_model: bool = True
    logging_steps: int = 1
    dataloader_num_workers: int = 0
    dataloader_pin_memory: bool = False
    preprocessing_num_workers: int | None = None
    #: train only the last (sampled) assistant turn of each sample
    mask_history: bool = True
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_target: str = "all"
    #: KTO / DPO
    pref_beta: float = 0.1
    pref_loss: str = "sigmoid"
    kto_chosen_weight: float = 1.0
    kto_rejected_weight: float = 1.0
    seed: int = 42
    #: extra LLaMA-Factory keys passed verbatim (they override the generated ones)
    llamafactory_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"algorithm.stage must be one of {', '.join(STAGES)} (got {self.stage!r})")
        if self.finetuning_type not in FINETUNING_TYPES:
            raise ConfigError(f"algorithm.finetuning_type must be full or lora (got {self.finetuning_type!r})")


@dataclass
class DataConfig:
    """How the LLaMA-Factory dataset is written and checked."""

    #: fraction of samples held out as a validation split (0 = none)
    val_split_ratio: float = 0.0
    #: rows checked for token fidelity: -1 = all (about 1 ms a row), 0 = off
    fidelity_samples: int = -1
    #: a checked reply whose text LLaMA-Factory tokenizes differently from the sampled ids: drop | fail
    noncanonical: str = "drop"
    #: images per sample at most (the most recent ones are kept)
    max_images_per_sample: int = 5
    #: expert demonstrations to mix in (python -m rollout_engine.demonstrations): one absolute path or a list,
    #: each a demonstrations.jsonl or the folder holding one; [] = none
    demonstrations: Any = field(default_factory=list)
    #: demonstration steps added to each update at most, a seeded draw: -1 = all, 0 = none
    demonstration_samples: int = -1
    #: add them to the updates of iterations up to this one: -1 = every update, 0 = only the first (a warm start)
    demonstration_last_iteration: int = -1

    def __post_init__(self) -> None:
        problems = []
        if self.noncanonical not in ("drop", "fail"):
            problems.append(f"data.noncanonical must be drop or fail (got {self.noncanonical!r})")
        paths = self.demonstrations if isinstance(self.demonstrations, list | tuple) else [self.demonstrations]
        self.demonstrations = [str(p) for p in paths if p is not None and str(p) != ""]
        for name in ("demonstration_samples", "demonstration_last_iteration"):
            if getattr(self, name) < -1:
                problems.append(f"data.{name} must be -1 (no limit) or >= 0 (got {getattr(self, name)})")
        if problems:
            raise ConfigError(problems)


@dataclass
class LaunchConfig:
    """How llamafactory-cli runs: torchrun layout, DeepSpeed preset, time limit."""

    #: a preset under configs/deepspeed/ (auto = none on CPU, zero1 on GPU)
    deepspeed: str = "auto"
    #: processes on this node; 0 = local GPUs (1 on CPU)
    nproc_per_node: int = 0
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    #: torchrun's rendezvous port; 0 = a free one on this machine (one node only: several need the master's)
    master_port: int = 0
    #: this node's address (run.sh --node-addr): gloo and NCCL use the interface that holds it,
    #: unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are set; "" = theirs (the host name's address)
    node_addr: str = ""
    #: the sha256 of the dataset and YAML the master prepared (its training/iter_<n>/dataset.sha256; set
    #: by run.sh on several nodes): a node trains only on those files, waiting `dataset_wait_s` for them
    dataset_sha256: str = ""
    dataset_wait_s: float = 60.0
    #: seconds before the training is stopped (SIGTERM), then `grace_s` more before SIGKILL
    timeout_s: float = 3600.0
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        if self.deepspeed not in DEEPSPEED_PRESETS:
            raise ConfigError(
                f"launch.deepspeed must be one of {', '.join(DEEPSPEED_PRESETS)} (got {self.deepspeed!r})"
            )
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"launch.master_port must be a TCP port, 0..65535 (got {self.master_port})")


@dataclass
class PromotionConfig:
    """What becomes of the trained weights."""

    #: policy versions kept under <log>/policy (the current one is always kept)
    keep_last: int = 3
    #: also keep the optimizer/scheduler state (HF Trainer files) under v<NNNN>/optimizer/
    keep_optimizer: bool = False
    #: dtype of the served weights: auto = the model the update trained from (the base model's), or one of
    #: bfloat16, float16, float32; wider trainer weights are kept in v<NNNN>/fp32/ and trained on next
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in PROMOTION_DTYPES:
            raise ConfigError(f"promotion.dtype must be one of {', '.join(PROMOTION_DTYPES)} (got {self.dtype!r})")


@dataclass
class RevertConfig:
    """phase=revert (run.sh --keep-best): promote model_path (the best version's folder, or the base model's)
    as the next version. run.sh fills it from `python -m coordinator keep-best`'s decision."""

    #: the original version whose weights model_path holds (0: the base model); -1 = not set
    to_version: int = -1
    #: the served version that measured worse (0: the base model)
    replaced: int = -1
    #: pooled held-out success rates (0..1) of the replaced and the best policy, and the margin in points
    replaced_success_rate: float = 0.0
    best_success_rate: float = 0.0
    margin_points: float = 0.0


WANDB_MODES = ("offline", "online")


@dataclass
class TensorBoardConfig:
    """TensorBoard event files: Baton's metrics (<log>/trackers/tensorboard/, written by `python -m coordinator
    track`) and LLaMA-Factory's training curves (report_to, in <log>/training/iter_<NNNN>/tensorboard/)."""

    _target_: str = "coordinator.trackers.TensorBoardTracker"


@dataclass
class WandbConfig:
    """A Weights & Biases run per log path (<log>/trackers/wandb/), and one per training (report_to)."""

    _target_: str = "coordinator.trackers.WandbTracker"
    project: str = "baton"
    #: offline writes local run directories (`wandb sync` uploads them later); online needs a login and network
    mode: str = "offline"
    #: the W&B group of the run and its trainings; "" = the log path's folder name
    group: str = ""

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ConfigError(f"tracker.wandb.mode must be offline or online (got {self.mode!r})")


@dataclass
class TrackerConfig:
    """The experiment trackers of a run (configs/tracker/: none, tensorboard, wandb; several as a list,
    tracker=[tensorboard,wandb]). An unset entry is off. Lives in the update config, which every run
    composes and whose training reports to the same trackers."""

    tensorboard: TensorBoardConfig | None = None
    wandb: WandbConfig | None = None

    def report_to(self) -> list[str]:
        """LLaMA-Factory's (the HF Trainer's) `report_to` names of the chosen trackers."""
        return [name for name in ("tensorboard", "wandb") if getattr(self, name) is not None]


@dataclass
class UpdateConfig:
    """Top level of configs/update.yaml."""

    #: the experiment's log path (journals in, policy out)
    log_path: str = MISSING
    #: the iteration whose rollouts were just collected; the new policy is trained from it
    iteration: int = MISSING
    #: model to fine-tune; "" = <log_path>/policy/current
    model_path: str = ""
    #: LLaMA-Factory chat template (smollm2 matches SmolLM2's own template token for token)
    template: str = "smollm2"
    #: the system prompt LLaMA-Factory uses when a sample has none (null = the template's own); it must
    #: equal the one the model's chat template inserts, or token fidelity fails
    default_system: str | None = None
    #: prepare | train | promote | all (multi-node: node 0 prepares and promotes, every node trains);
    #: check = ask LLaMA-Factory about this config and stop (run.sh does it before the first rollout)
    phase: str = "all"
    algorithm: AlgorithmConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    revert: RevertConfig = field(default_factory=RevertConfig)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ConfigError(f"phase must be one of {', '.join(PHASES)} (got {self.phase!r})")
        if self.phase == "revert" and self.revert.to_version < 0:
            raise ConfigError(f"phase=revert needs revert.to_version >= 0 (got {self.revert.to_version})")


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (YAML files extend them by name)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="update_schema", node=UpdateConfig)
    store.store(group="algorithm", name="algorithm_schema", node=AlgorithmConfig)
    store.store(group="algorithm/selection", name="rft_schema", node=RFTSelectionConfig)
    store.store(group="algorithm/selection", name="kto_schema", node=KTOSelectionConfig)
    store.store(group="algorithm/selection", name="dpo_schema", node=DPOSelectionConfig)


def model_path(cfg: UpdateConfig) -> Path:
    """The model to fine-tune: `model_path`, else the current policy."""
    return Path(cfg.model_path) if cfg.model_path else Layout(cfg.log_path).policy_current


def validate(cfg: UpdateConfig) -> None:
    """Check fields against each other; raise one ConfigError listing every problem."""
    problems: list[str] = []
    alg, sel, launch = cfg.algorithm, cfg.algorithm.selection, cfg.launch
    if cfg.iteration < 0:
        problems.append(f"iteration must be >= 0 (got {cfg.iteration})")
    model = model_path(cfg)
    if not (model / "config.json").is_file():
        what = "model_path" if cfg.model_path else "model_path (empty: <log_path>/policy/current)"
        problems.append(
            f"{what} has no HF model at {model} (config.json missing); pass model_path=<HF folder> "
            "(run.sh: set BATON_BASE_MODEL to one, or run bash scripts/prepare.sh --data-path D)"
        )
    positives = {
        "algorithm.per_device_train_batch_size": alg.per_device_train_batch_size,
        "algorithm.gradient_accumulation_steps": alg.gradient_accumulation_steps,
        "algorithm.cutoff_len": alg.cutoff_len,
        "algorithm.logging_steps": alg.logging_steps,
        "algorithm.selection.last_k_iterations": sel.last_k_iterations,
        "launch.nnodes": launch.nnodes,
    }
    problems += [f"{name} must be >= 1 (got {value})" for name, value in positives.items() if value < 1]
    if alg.warmup_steps > 0 and alg.warmup_ratio > 0:
        problems.append(
            "algorithm.warmup_steps and algorithm.warmup_ratio are both set "
            f"(got {alg.warmup_steps} and {alg.warmup_ratio}); set one of them to 0"
        )
    if alg.max_steps == 0 or alg.num_train_epochs <= 0:
        problems.append(
            f"algorithm.max_steps ({alg.max_steps}) must be -1 or >= 1 and algorithm.num_train_epochs "
            f"({alg.num_train_epochs}) > 0"
        )
    problems += _check_stage(alg)
    if cfg.phase in ("check", "prepare", "all"):  # train and promote use what prepare wrote and checked
        problems += _check_template(cfg.template)  # (its import of LLaMA-Factory's data module: 13 s on a core)
    if not 0 <= cfg.data.val_split_ratio < 1:
        problems.append(f"data.val_split_ratio must be in [0, 1) (got {cfg.data.val_split_ratio})")
    if not 0 <= launch.node_rank < launch.nnodes:
        problems.append(f"launch.node_rank must be in [0, launch.nnodes={launch.nnodes}) (got {launch.node_rank})")
    if getattr(sel, "shortest_per_task", 0) < 0:
        problems.append(
            f"algorithm.selection.shortest_per_task must be >= 0, 0 = every success (got {sel.shortest_per_task})"
        )
    if launch.nproc_per_node < 0:
        problems.append(f"launch.nproc_per_node must be >= 0, 0 = detect (got {launch.nproc_per_node})")
    if launch.timeout_s <= 0 or launch.grace_s < 0:
        problems.append(
            f"launch.timeout_s must be > 0 and launch.grace_s >= 0 (got {launch.timeout_s}, {launch.grace_s})"
        )
    if cfg.promotion.keep_last < 1:
        problems.append(f"promotion.keep_last must be >= 1 (got {cfg.promotion.keep_last})")
    problems += _check_demonstrations(cfg)
    if cfg.promotion.keep_optimizer and alg.save_only_model:
        problems.append("promotion.keep_optimizer needs algorithm.save_only_model=false (no optimizer state is saved)")
    if problems:
        raise ConfigError(problems)


def _check_template(name: str) -> list[str]:
    """The template must be one LLaMA-Factory knows (checked where LLaMA-Factory is installed)."""
    try:
        from llamafactory.data.template import TEMPLATES
    except ImportError:
        return []
    if name in TEMPLATES:
        return []
    common = [t for t in ("smollm2", "chatml", "llama3", "qwen3", "mistral", "gemma3", "phi4") if t in TEMPLATES]
    shown = difflib.get_close_matches(name, TEMPLATES, n=4, cutoff=0.6) or common
    return [
        f"template={name!r} is not a LLaMA-Factory template; one of: {', '.join(shown)}, ... ({len(TEMPLATES)} "
        "in all: llamafactory/data/template.py); smollm2 renders the default model's chat template"
    ]


def _check_demonstrations(cfg: UpdateConfig) -> list[str]:
    """Demonstrations train as sft or kto rows, from files that exist and parse (read now: bad lines fail fast)."""
    if not cfg.data.demonstrations:
        return []
    if cfg.algorithm.stage == "dpo":
        return [
            f"data.demonstrations is set ({cfg.data.demonstrations}) but algorithm=dpo pairs sampled replies only; "
            "use algorithm=rft or algorithm=kto, or set data.demonstrations=[]"
        ]
    return check_demonstrations(cfg.data.demonstrations)


def _check_stage(alg: AlgorithmConfig) -> list[str]:
    """The selector must produce what the stage trains on."""
    wanted = {"sft": "RFTSelector", "kto": "KTOSelector", "dpo": "DPOSelector"}[alg.stage]
    target = str(getattr(alg.selection, "_target_", ""))
    if not target.endswith(wanted):
        return [
            f"algorithm.selection._target_ {target!r} does not produce {alg.stage} samples; use "
            f"training.selection.{wanted} (or algorithm={alg.stage if alg.stage != 'sft' else 'rft'})"
        ]
    return []
