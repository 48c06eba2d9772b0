"""Structured config of the update phase (`python -m training --config-name update`).

The dataclasses below are the schema; `register_configs()` stores them in
Hydra's ConfigStore (called by the entry point, never at import), and the YAML
under configs/ (update.yaml, algorithm/*.yaml, ...) only sets values. Single
fields are checked in `__post_init__`; `validate` checks fields against each
other and collects every problem into one `ConfigError`. Every numeric
setting's range and every enum's choices are declared beside the setting
(`setting(default, Range(...) | Choice(...))`, rollout_engine.schema); `validate`
checks them first. This module must stay importable in the app environment (run.sh
composes and checks the update's config there): LLaMA-Factory is imported only where
it is installed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from rollout_engine import schema
from rollout_engine.config import ModelConfig
from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout
from rollout_engine.schema import Choice, Range, setting
from training.demonstration_files import check_demonstrations

STAGES = ("sft", "kto", "dpo")
FINETUNING_TYPES = ("full", "lora")
PHASES = ("prepare", "train", "promote", "all", "check", "revert")
PROMOTION_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: what run.sh says the node's vLLM computes in ("": not known, as when the update runs on its own)
SERVED_DTYPES = ("", "bfloat16", "float16", "float32")
DEEPSPEED_PRESETS = ("auto", "none", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload")
#: the HF Trainer's schedulers (transformers.SchedulerType of the pinned transformers)
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)
#: LLaMA-Factory's preference losses (FinetuningArguments.pref_loss)
PREF_LOSSES = ("sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo")
NONCANONICAL = ("drop", "fail")
#: data.episode_rows (training.episodes.EPISODE_ROWS)
EPISODE_ROWS = ("auto", "per_turn")
#: how the policy-gradient loss averages its per-token terms (training.pg_loss)
PG_AGGREGATIONS = ("token_mean", "sequence_mean")
#: what the ratio of the policy-gradient loss is formed against (training.pg_trainer)
OLD_LOGPROBS = ("rollout", "trainer")
WANDB_MODES = ("offline", "online")
#: seeds are unsigned 32-bit (numpy's, which the trainer seeds)
MAX_SEED = (1 << 32) - 1
#: more tokens than any model's context: a value above it is a typo
MAX_TOKENS = 1 << 20


@dataclass
class SelectionConfig:
    """Which samples to train on. `_target_` picks the selector class (training.selection)."""

    _target_: str = MISSING
    #: use the train journals of this many most recent iterations (<= the current one)
    last_k_iterations: int = setting(4, Range(low=1))
    #: keep only tasks whose samples disagree (some succeed, some fail)
    disagreement_filter: bool = False
    #: skip steps after which the environment state did not change
    skip_unchanged_steps: bool = True
    #: seed of the draw (the iteration number is added, so each iteration draws anew)
    seed: int = setting(0, Range(0, MAX_SEED))


@dataclass
class RFTSelectionConfig(SelectionConfig):
    """Filtered behaviour cloning: steps of successful trajectories (WebGym's recipe)."""

    _target_: str = "training.selection.RFTSelector"
    #: how many steps to draw (all when fewer exist); 0 = none: an update on demonstrations alone
    positive_samples_to_train: int = setting(1800, Range(low=0, note="0 = none (demonstrations alone)"))
    #: a step of iteration i (oldest used = 1) is drawn with weight i**power; 0 = uniform
    recency_bias_power: float = setting(2.0, Range(0, 100))
    #: at most this many successes per task and iteration, the shortest replies first (0 = all; against length drift,
    #: docs/benchmarks.md 3c)
    shortest_per_task: int = setting(1, Range(low=0, note="0 = every success"))
    #: divide each step's draw weight by its family's step count: every family an equal share of the draw
    balance_families: bool = False


@dataclass
class KTOSelectionConfig(SelectionConfig):
    """Desirable = steps of successful trajectories, undesirable = steps of failed ones."""

    _target_: str = "training.selection.KTOSelector"
    #: at most this many samples (0 = all), drawn uniformly
    max_samples: int = setting(0, Range(low=0, note="0 = all"))


@dataclass
class DPOSelectionConfig(SelectionConfig):
    """Pairs of a successful and a failed sample of the same task (first steps share the prompt)."""

    _target_: str = "training.selection.DPOSelector"
    #: pairs per task at most
    max_pairs_per_task: int = setting(4, Range(low=1))
    #: at most this many pairs in all (0 = all)
    max_pairs: int = setting(0, Range(low=0, note="0 = all"))


@dataclass
class GroupSelectionConfig(SelectionConfig):
    """Policy gradient (algorithm=grpo): every episode of a task's group of samples whose rewards differ, each
    step carrying the episode's advantage (its reward normalised within the group: training.advantages)."""

    _target_: str = "training.selection.GroupSelector"
    #: GRPO divides each group's centred rewards by their standard deviation; false = Dr. GRPO's centred rewards
    scale_by_std: bool = True


@dataclass
class PolicyGradientConfig:
    """The clipped policy-gradient loss of algorithm=grpo (training.pg_loss), inside LLaMA-Factory's SFT trainer."""

    #: the ratio's clip range [1 - clip_low, 1 + clip_high] (DAPO's decoupled "clip-higher": 0.2 / 0.28)
    clip_low: float = setting(0.2, Range(0, 1, high_open=True))
    clip_high: float = setting(0.28, Range(low=0))
    #: token_mean: every trained token of an optimizer step weighs the same (DAPO); sequence_mean: each
    #: sequence's tokens are averaged first, then the sequences (GRPO's original)
    aggregation: str = setting("token_mean", Choice(PG_AGGREGATIONS))
    #: weight of the k3 KL estimate to the reference model; 0 = off (no reference model is loaded)
    kl_beta: float = setting(0.0, Range(low=0))
    #: the ratio's denominator: `rollout`, the log-probabilities vLLM sampled with (the journal's); `trainer`, the
    #: trainer's own before the update's first step, recomputed in a no-grad pass over its rows (verl's
    #: old_log_prob: the ratio starts at 1 whatever precision vLLM serves in), the sampler's difference then
    #: corrected per token by truncated importance sampling (tis_cap)
    old_logprobs: str = setting("rollout", Choice(OLD_LOGPROBS))
    #: old_logprobs=trainer: each token's policy-gradient term weighed by min(exp(trainer - rollout), tis_cap)
    #: (Yao et al. 2025's truncated importance sampling; verl's default cap, 2)
    tis_cap: float = setting(2.0, Range(low=1))


@dataclass
class AlgorithmConfig:
    """Sample selection plus every LLaMA-Factory hyperparameter WebGym exposes."""

    name: str = MISSING
    #: LLaMA-Factory stage: sft (rft), kto or dpo
    stage: str = setting("sft", Choice(STAGES))
    selection: Any = MISSING
    finetuning_type: str = setting("full", Choice(FINETUNING_TYPES))
    cutoff_len: int = setting(2048, Range(1, MAX_TOKENS))
    per_device_train_batch_size: int = setting(1, Range(low=1))
    per_device_eval_batch_size: int = setting(1, Range(low=1))
    gradient_accumulation_steps: int = setting(1, Range(low=1))
    learning_rate: float = setting(1e-6, Range(0, 1, low_open=True))
    lr_scheduler_type: str = setting("constant_with_warmup", Choice(LR_SCHEDULERS))
    warmup_steps: int = setting(0, Range(low=0))
    warmup_ratio: float = setting(0.0, Range(0, 1))
    num_train_epochs: float = setting(1.0, Range(low=0, low_open=True))
    #: > 0 stops after this many optimizer steps
    max_steps: int = setting(-1, Range(low=1, special={-1: "no limit: num_train_epochs decides"}))
    weight_decay: float = setting(0.0, Range(0, 1))
    #: 0 = no clipping
    max_grad_norm: float = setting(1.0, Range(low=0))
    #: null = bf16 on GPU, fp32 on CPU
    bf16: bool | None = None
    gradient_checkpointing: bool = False
    save_only_model: bool = True
    logging_steps: int = setting(1, Range(low=1))
    dataloader_num_workers: int = setting(0, Range(low=0))
    dataloader_pin_memory: bool = False
    preprocessing_num_workers: int | None = setting(None, Range(low=1, note="null = one process"))
    #: train only the last (sampled) assistant turn of each sample
    mask_history: bool = True
    lora_rank: int = setting(8, Range(low=1))
    lora_alpha: int = setting(16, Range(low=1))
    lora_target: str = "all"
    #: KTO / DPO
    pref_beta: float = setting(0.1, Range(low=0, low_open=True))
    pref_loss: str = setting("sigmoid", Choice(PREF_LOSSES))
    kto_chosen_weight: float = setting(1.0, Range(low=0))
    kto_rejected_weight: float = setting(1.0, Range(low=0))
    #: algorithm=grpo: the policy-gradient loss that replaces the SFT loss of stage sft (null = the stage's own)
    policy_gradient: PolicyGradientConfig | None = None
    #: the optimizer's state (Adam's moments; not a LoRA's, nor under DeepSpeed) and the schedule's step carry
    #: from the version an update trains from to the version it makes (training.carry; false: each update afresh)
    carry_optimizer: bool = True
    seed: int = setting(42, Range(0, MAX_SEED))
    #: extra LLaMA-Factory keys passed verbatim (they override the generated ones)
    llamafactory_overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """How the LLaMA-Factory dataset is written and checked."""

    #: fraction of samples held out as a validation split (0 = none)
    val_split_ratio: float = setting(0.0, Range(0, 1, high_open=True))
    #: rows checked for token fidelity: -1 = all (about 1 ms a row), 0 = off
    fidelity_samples: int = setting(-1, Range(low=0, special={-1: "all"}, note="0 = off"))
    #: a checked reply whose text LLaMA-Factory tokenizes differently from the sampled ids: drop | fail
    noncanonical: str = setting("drop", Choice(NONCANONICAL))
    #: rows whose sampled tokens' log-probabilities the trainer's model recomputes and compares with vLLM's
    #: (training.logprob_check: warns, or refuses the update, when the mean gap is beyond numerics): -1 = all,
    #: 0 = off. It loads the model on this node's CPU in the trainer's precision (docs/update.md)
    logprob_samples: int = setting(0, Range(low=0, special={-1: "all"}, note="0 = off"))
    #: auto = one row per episode when its turns chain (each prompt extends the previous prompt and reply), the
    #: whole episode trained as one sequence; per_turn = one row per turn, each with its history (training.episodes)
    episode_rows: str = setting("auto", Choice(EPISODE_ROWS))
    #: images per sample at most: a sample whose prompt holds more is not trained on (too_many_images)
    max_images_per_sample: int = setting(5, Range(low=0))
    #: expert demonstrations to mix in (python -m rollout_engine.demonstrations): one absolute path or a list,
    #: each a demonstrations.jsonl or the folder holding one; [] = none
    demonstrations: Any = field(default_factory=list)
    #: demonstration steps added to each update at most, a seeded draw: -1 = all, 0 = none
    demonstration_samples: int = setting(-1, Range(low=0, special={-1: "no limit"}))
    #: add them to the updates of iterations up to this one: -1 = every update, 0 = only the first (a warm start)
    demonstration_last_iteration: int = setting(-1, Range(low=0, special={-1: "no limit"}))

    def __post_init__(self) -> None:
        paths = self.demonstrations if isinstance(self.demonstrations, list | tuple) else [self.demonstrations]
        self.demonstrations = [str(p) for p in paths if p is not None and str(p) != ""]


@dataclass
class LaunchConfig:
    """How llamafactory-cli runs: torchrun layout, DeepSpeed preset, time limit."""

    #: a preset under configs/deepspeed/ (auto = none on CPU, zero1 on GPU)
    deepspeed: str = setting("auto", Choice(DEEPSPEED_PRESETS))
    #: processes on this node; 0 = local GPUs (1 on CPU)
    nproc_per_node: int = setting(0, Range(low=0, note="0 = detect"))
    nnodes: int = setting(1, Range(low=1))
    node_rank: int = setting(0, Range(low=0))
    master_addr: str = "127.0.0.1"
    #: torchrun's rendezvous port; 0 = a free one on this machine (one node only: several need the master's)
    master_port: int = setting(0, Range(0, 65535, note="a TCP port, 0 = a free one"))
    #: this node's address (run.sh --node-addr): gloo and NCCL use the interface that holds it,
    #: unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are set; "" = theirs (the host name's address)
    node_addr: str = ""
    #: the sha256 of the dataset and YAML the master prepared (its training/iter_<n>/dataset.sha256; set
    #: by run.sh on several nodes): a node trains only on those files, waiting `dataset_wait_s` for them
    dataset_sha256: str = ""
    dataset_wait_s: float = setting(60.0, Range(low=0, unit="seconds"))
    #: seconds before the training is stopped (SIGTERM), then `grace_s` more before SIGKILL
    timeout_s: float = setting(3600.0, Range(low=0, low_open=True, unit="seconds"))
    grace_s: float = setting(10.0, Range(low=0, unit="seconds"))


@dataclass
class PromotionConfig:
    """What becomes of the trained weights."""

    #: policy versions kept under <log>/policy (the current one is always kept)
    keep_last: int = setting(3, Range(low=1))
    #: dtype of the served weights: auto = the model the update trained from (the base model's), or the
    #: server's `served_dtype` when that is wider; or one of bfloat16, float16, float32. Wider trainer weights
    #: are kept in v<NNNN>/fp32/ and trained on next (training.precision.promotion_dtype)
    dtype: str = setting("auto", Choice(PROMOTION_DTYPES))
    #: the dtype the node's vLLM computes in, filled by run.sh (coordinator.serving.choose_dtype)
    served_dtype: str = setting("", Choice(SERVED_DTYPES))


@dataclass
class RevertConfig:
    """phase=revert (run.sh --keep-best): promote model_path (the best version's folder, or the base model's)
    as the next version. run.sh fills it from `python -m coordinator keep-best`'s decision."""

    #: the original version whose weights model_path holds (0: the base model); -1 = not set
    to_version: int = setting(-1, Range(low=0, special={-1: "not set"}))
    #: the served version that measured worse (0: the base model)
    replaced: int = setting(-1, Range(low=0, special={-1: "not set"}))
    #: pooled held-out success rates (0..1) of the replaced and the best policy, and the margin in points
    replaced_success_rate: float = setting(0.0, Range(0, 1))
    best_success_rate: float = setting(0.0, Range(0, 1))
    margin_points: float = setting(0.0, Range(0, 100))


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
    mode: str = setting("offline", Choice(WANDB_MODES))
    #: the W&B group of the run and its trainings; "" = the log path's folder name
    group: str = ""


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
    iteration: int = setting(MISSING, Range(low=0))
    #: model to fine-tune; "" = <log_path>/policy/current
    model_path: str = ""
    #: the policy's model (rollout_engine.config.ModelConfig, shared with the rollout config): the update reads
    #: its template, default_system and chat_template_kwargs (training.chat_template)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    #: prepare | train | promote | all (multi-node: node 0 prepares and promotes, every node trains);
    #: check = ask LLaMA-Factory about this config and stop (run.sh does it before the first rollout)
    phase: str = setting("all", Choice(PHASES))
    algorithm: AlgorithmConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    revert: RevertConfig = field(default_factory=RevertConfig)

    def __post_init__(self) -> None:
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
    store.store(group="algorithm/selection", name="group_schema", node=GroupSelectionConfig)


def model_path(cfg: UpdateConfig) -> Path:
    """The model to fine-tune: `model_path`, else the current policy."""
    return Path(cfg.model_path) if cfg.model_path else Layout(cfg.log_path).policy_current


def validate(cfg: UpdateConfig) -> None:
    """Check fields against each other; raise one ConfigError listing every problem."""
    problems: list[str] = schema.problems(cfg)
    alg, launch = cfg.algorithm, cfg.launch
    model = model_path(cfg)
    if not (model / "config.json").is_file():
        what = "model_path" if cfg.model_path else "model_path (empty: <log_path>/policy/current)"
        problems.append(
            f"{what} has no HF model at {model} (config.json missing); pass model_path=<HF folder> "
            "(run.sh: set model_config.model to one, or run bash scripts/prepare.sh --data-path D)"
        )
    if alg.warmup_steps > 0 and alg.warmup_ratio > 0:
        problems.append(
            "algorithm.warmup_steps and algorithm.warmup_ratio are both set "
            f"(got {alg.warmup_steps} and {alg.warmup_ratio}); set one of them to 0"
        )
    problems += _check_stage(alg)
    if cfg.phase in ("check", "prepare", "all"):  # train and promote use what prepare wrote and checked
        problems += _check_template(cfg.model_config.template)  # (LLaMA-Factory's data module: 13 s on a core)
    if launch.node_rank >= launch.nnodes >= 1:
        problems.append(f"launch.node_rank must be in [0, launch.nnodes={launch.nnodes}) (got {launch.node_rank})")
    problems += _check_demonstrations(cfg)
    problems += _check_policy_gradient(cfg)
    if problems:
        raise ConfigError(problems)


def _check_template(name: str) -> list[str]:
    """A named template must be one LLaMA-Factory knows (checked where LLaMA-Factory is installed); whether it
    renders the model's chat template is training.chat_template's check."""
    if name == "auto":
        return []
    try:
        from llamafactory.data.template import TEMPLATES
    except ImportError:
        return []
    if name in TEMPLATES:
        return []
    common = [t for t in ("smollm2", "chatml", "llama3", "qwen3", "mistral", "gemma3", "phi4") if t in TEMPLATES]
    shown = difflib.get_close_matches(name, TEMPLATES, n=4, cutoff=0.6) or common
    return [
        f"model_config.template={name!r} is not a LLaMA-Factory template; one of: {', '.join(shown)}, ... "
        f"({len(TEMPLATES)} in all: llamafactory/data/template.py); model_config.template=auto finds the one "
        "that renders the model's chat template"
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
    """The selector must produce what the stage trains on (the policy-gradient loss: GroupSelector's rows)."""
    if alg.policy_gradient is not None and alg.stage != "sft":
        return [
            f"algorithm.policy_gradient replaces the loss of stage sft, not of {alg.stage!r}; set "
            "algorithm.stage=sft (or algorithm=grpo)"
        ]
    wanted = {"sft": "RFTSelector", "kto": "KTOSelector", "dpo": "DPOSelector"}.get(alg.stage)
    if wanted is None:  # an unknown stage: the schema's problem
        return []
    if alg.policy_gradient is not None:
        wanted = "GroupSelector"
    target = str(getattr(alg.selection, "_target_", ""))
    if target.endswith("GroupSelector") and alg.policy_gradient is None:
        return [
            "algorithm.selection._target_ training.selection.GroupSelector gives each row an advantage that only "
            "the policy-gradient loss reads; use algorithm=grpo (or set algorithm.policy_gradient)"
        ]
    if not target.endswith(wanted):
        algorithm = "grpo" if alg.policy_gradient is not None else (alg.stage if alg.stage != "sft" else "rft")
        return [
            f"algorithm.selection._target_ {target!r} does not produce {algorithm} samples; use "
            f"training.selection.{wanted} (or algorithm={algorithm})"
        ]
    return []


def _check_policy_gradient(cfg: UpdateConfig) -> list[str]:
    """The policy-gradient loss trains sampled episodes only, and has no evaluation loss."""
    if cfg.algorithm.policy_gradient is None:
        return []
    problems = []
    if cfg.data.val_split_ratio > 0:
        problems.append(
            f"data.val_split_ratio={cfg.data.val_split_ratio} but algorithm=grpo has no validation loss (its loss "
            "needs each row's advantage); set data.val_split_ratio=0"
        )
    if cfg.data.demonstrations:
        problems.append(
            f"data.demonstrations is set ({cfg.data.demonstrations}) but algorithm=grpo trains sampled episodes "
            "(a demonstration has no reward within a group of samples); use algorithm=rft or algorithm=kto, or set "
            "data.demonstrations=[]"
        )
    return problems
