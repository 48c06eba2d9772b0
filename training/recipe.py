"""The LLaMA-Factory training YAML, generated from `algorithm` (saved beside the dataset).

    recipe = build_recipe(cfg, files, model, output_dir, device)   # a dict
    save_recipe(path, recipe)
    args = parse_recipe(recipe)                                     # train environment: LLaMA-Factory's reading
    tokenizer_module, template = load_template(args)

Every hyperparameter of `AlgorithmConfig` maps to the LLaMA-Factory key of the
same name, except `gradient_checkpointing`, which becomes LLaMA-Factory's
`disable_gradient_checkpointing` (its negation); `llamafactory_overrides` is merged last. A vision-language
model's `image_min_pixels`/`image_max_pixels` are its image processor's (`rollout_engine.vision.image_pixels`), so
that LLaMA-Factory expands each image into the tokens vLLM did. The DeepSpeed preset is a
file under configs/deepspeed/ (`auto`: none on CPU, ZeRO-1 on GPU), written into the YAML as a dict
(`deepspeed_config`). With `algorithm.carry_optimizer` the YAML's `baton_carry` says where the training reads and
writes the optimizer state carried across updates (training.carry). bf16 `null` means bf16 on GPU and fp32
on CPU; with DeepSpeed a full (or freeze) fine-tune computes in bf16 through DeepSpeed's `torch_autocast` on
fp32 parameters, so that the trainer saves fp32 weights for the next update to start from (`precision`). With
`algorithm.policy_gradient` (algorithm=grpo) the YAML carries it as `baton_policy_gradient`, which Baton's
trainer reads and takes out (training.trainer_run).
`parse_recipe` / `load_template` read
a recipe back the way `llamafactory-cli train` does, as one CPU process (token
fidelity and `phase=check` use them; a value LLaMA-Factory refuses is a
`ConfigError` naming the setting, its value and the fix); `check_deepspeed` checks the preset's file and package.
`tracker_env` is the environment that points LLaMA-Factory's `report_to` trackers
(the chosen `tracker`) into the iteration's training folder.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_engine.errors import ConfigError
from rollout_engine.files import save_text
from rollout_engine.layout import iteration_name
from rollout_engine.vision import image_pixels
from training.carry import CARRY, OPTIMIZER_FOLDER, plan_for
from training.config import AlgorithmConfig, UpdateConfig
from training.dataset import DatasetFiles

if TYPE_CHECKING:
    from training.chat_template import Choice

REPO = Path(__file__).resolve().parent.parent
DEEPSPEED_DIR = REPO / "configs" / "deepspeed"

#: AlgorithmConfig fields copied verbatim into the YAML
HYPERPARAMETERS = (
    "stage",
    "finetuning_type",
    "cutoff_len",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "num_train_epochs",
    "max_steps",
    "weight_decay",
    "max_grad_norm",
    "save_only_model",
    "logging_steps",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "preprocessing_num_workers",
    "mask_history",
    "seed",
)
LORA_KEYS = ("lora_rank", "lora_alpha", "lora_target")
PREF_KEYS = {"dpo": ("pref_beta", "pref_loss"), "kto": ("pref_beta", "kto_chosen_weight", "kto_rejected_weight")}
#: the recipe's key for algorithm.policy_gradient: Baton's trainer (training.pg_trainer) takes it out before
#: LLaMA-Factory reads the rest (its parser refuses keys it does not know)
POLICY_GRADIENT = "baton_policy_gradient"
#: keys left out when one process parses a recipe: DeepSpeed needs torchrun's workers; the evaluation keys
#: are Baton's own (token fidelity reads each split by name)
ONE_PROCESS_DROPPED = ("deepspeed", "eval_dataset", "do_eval", "eval_strategy", POLICY_GRADIENT, CARRY)
#: the recipe's keys that are Baton's own (training.trainer_run takes them out)
BATON_KEYS = (POLICY_GRADIENT, CARRY)


@dataclass(frozen=True)
class Device:
    """Where training runs: `cuda` with `count` GPUs, or `cpu` (count 1 process)."""

    kind: str
    count: int
    #: CUDA_VISIBLE_DEVICES as the node set it (None: unset); the trainer's processes get it back
    visible: str | None = None


def deepspeed_file(preset: str, device: Device) -> Path | None:
    """The DeepSpeed JSON for `preset` (None = no DeepSpeed)."""
    if preset == "auto":
        preset = "zero1" if device.kind == "cuda" else "none"
    return None if preset == "none" else DEEPSPEED_DIR / f"{preset}.json"


#: DeepSpeed's `torch_autocast` section: parameters stay fp32, torch.autocast runs the forward in bf16
AUTOCAST_BF16 = {"enabled": True, "dtype": "bfloat16"}
#: finetuning types whose trained weights are a LoRA's: the base stays frozen, and the merge reads its
#: full-precision weights (training.precision), so bf16 parameters lose nothing
ADAPTERS = ("lora", "oft")


def precision(bf16: bool | None, preset: str, device: Device, finetuning_type: str) -> tuple[bool, dict | None]:
    """The recipe's `bf16` and its DeepSpeed config (None = no DeepSpeed) for `algorithm.bf16` (None: bf16 on
    a GPU), `launch.deepspeed` and the node's device.

    DeepSpeed's bf16 mode (`bf16.enabled`) keeps bf16 parameters and the fp32 master weights only in its
    optimizer state, which the saved model does not include: the trainer would save the bf16 rounding, and
    an update at the default learning rates (1e-6, 5e-7) is far below bf16's resolution. So a bf16 fine-tune
    of the weights themselves (full, freeze) under DeepSpeed uses DeepSpeed's `torch_autocast` instead:
    fp32 parameters (ZeRO-3 uses them as the master weights; ZeRO-1/2 keep their fp32 master partition as
    well), bf16 matmuls, fp32 weights saved. HF's `bf16` must then be off: it would fill `bf16.enabled`
    (HfTrainerDeepSpeedConfig.trainer_config_process), and accelerate would add it
    (DeepSpeedPlugin.set_mixed_precision). A LoRA keeps DeepSpeed's bf16 mode (its base is frozen)."""
    bf16 = device.kind == "cuda" if bf16 is None else bf16
    path = deepspeed_file(preset, device)
    if path is None:
        return bf16, None
    config = json.loads(path.read_text())
    if not bf16 or finetuning_type in ADAPTERS:
        return bf16, config
    return False, config | {"bf16": {"enabled": False}, "torch_autocast": dict(AUTOCAST_BF16)}


@dataclass(frozen=True)
class RecipeArgs:
    """LLaMA-Factory's argument dataclasses for a recipe (ModelArguments, DataArguments, ...)."""

    model: Any
    data: Any
    training: Any
    finetuning: Any


def check_deepspeed(preset: str, device: Device) -> list[str]:
    """The preset's file must exist and the deepspeed package be installed (LLaMA-Factory requires it)."""
    path = deepspeed_file(preset, device)
    if path is None:
        return []
    which = f"launch.deepspeed={preset!r}" + (f" (zero1 on {device.kind})" if preset == "auto" else "")
    if not path.is_file():
        presets = ", ".join(["none", *sorted(p.stem for p in DEEPSPEED_DIR.glob("*.json"))])
        return [f"{which}: {path} does not exist; set launch.deepspeed to one of: {presets}"]
    if importlib.util.find_spec("deepspeed") is None:
        return [f"{which} needs the deepspeed package, which this environment lacks; set launch.deepspeed=none"]
    return []


def build_recipe(
    cfg: UpdateConfig,
    files: DatasetFiles,
    model: Path,
    output_dir: Path,
    device: Device,
    chosen: Choice,
    version: Path | None = None,
) -> dict:
    """The LLaMA-Factory YAML as a dict; `chosen` is the template that renders the model's chat template;
    `version`: the folder of the policy version (or base model) `model` belongs to, whose carried optimizer
    state the training starts from (training.carry; None: `model`'s own)."""
    alg: AlgorithmConfig = cfg.algorithm
    train_name, val_name = files.names
    recipe: dict[str, Any] = {
        "model_name_or_path": str(model),
        "trust_remote_code": True,
        "do_train": True,
        "dataset": train_name,
        "dataset_dir": str(files.directory),
        "template": chosen.template,
        **({"default_system": chosen.default_system} if chosen.default_system is not None else {}),
        "output_dir": str(output_dir),
        "overwrite_output_dir": True,
        "overwrite_cache": True,
        "save_strategy": "no" if alg.save_only_model else "epoch",
        "report_to": cfg.tracker.report_to() or "none",
        "run_name": iteration_name(cfg.iteration),
        "plot_loss": False,
    }
    if "enable_thinking" in cfg.model_config.chat_template_kwargs:  # rendered as vLLM renders the prompts
        recipe["enable_thinking"] = bool(cfg.model_config.chat_template_kwargs["enable_thinking"])
    if (pixels := image_pixels(model)) is not None:  # images resized as vLLM's processor resizes them
        recipe["image_min_pixels"], recipe["image_max_pixels"] = pixels
    recipe["bf16"], ds = precision(alg.bf16, cfg.launch.deepspeed, device, alg.finetuning_type)
    recipe |= {key: getattr(alg, key) for key in HYPERPARAMETERS if getattr(alg, key) is not None}
    # LLaMA-Factory checkpoints activations unless told not to, and ignores HF's `gradient_checkpointing`
    recipe["disable_gradient_checkpointing"] = not alg.gradient_checkpointing
    if alg.stage != "sft":  # LLaMA-Factory refuses mask_history outside sft (kto/dpo train the reply only)
        recipe.pop("mask_history")
    elif files.episode_rows:  # a row is a whole episode: every assistant turn is a sampled reply (training.episodes)
        recipe["mask_history"] = False
    if alg.finetuning_type == "lora":
        recipe |= {key: getattr(alg, key) for key in LORA_KEYS}
    recipe |= {key: getattr(alg, key) for key in PREF_KEYS.get(alg.stage, ())}
    if val_name:
        recipe |= {"eval_dataset": val_name, "eval_strategy": "epoch", "do_eval": True}
    if ds is not None:
        recipe["deepspeed"] = ds
    if alg.policy_gradient is not None:
        recipe[POLICY_GRADIENT] = asdict(alg.policy_gradient)
    if alg.carry_optimizer:
        recipe[CARRY] = plan_for(version or model, output_dir / OPTIMIZER_FOLDER, alg.finetuning_type)
    recipe |= dict(alg.llamafactory_overrides)
    return recipe


def tracker_env(cfg: UpdateConfig, run_dir: Path) -> dict[str, str]:
    """The environment LLaMA-Factory's trackers read (report_to): TensorBoard's logging dir and W&B's
    directory, mode, project and group, all inside the iteration's `run_dir` (training/iter_<NNNN>/)."""
    env: dict[str, str] = {}
    if cfg.tracker.tensorboard is not None:
        env["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
    if (wandb := cfg.tracker.wandb) is not None:
        env |= {
            "WANDB_DIR": str(run_dir),
            "WANDB_MODE": wandb.mode,
            "WANDB_PROJECT": wandb.project,
            "WANDB_RUN_GROUP": wandb.group or Path(cfg.log_path).name,
            "WANDB_SILENT": "true",
        }
    return env


def parse_recipe(recipe: dict) -> RecipeArgs:
    """LLaMA-Factory's own argument parser and checks on `recipe`, in this process (train environment), read
    as one process on the CPU: the update's own process only reads the YAML, and a process that sees several
    GPUs is one that would drive them all (LLaMA-Factory refuses that: "Please launch distributed training
    with llamafactory-cli or torchrun"), while one that picks a GPU takes a CUDA context on it. A key or value
    LLaMA-Factory refuses (ValueError, TypeError, AssertionError) raises ConfigError (`rejection`)."""
    from llamafactory.hparams import get_train_args

    args = {key: value for key, value in recipe.items() if key not in ONE_PROCESS_DROPPED} | {"use_cpu": True}
    try:
        model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
    except (ValueError, TypeError, AssertionError) as exc:
        raise ConfigError(rejection(exc, recipe)) from exc
    return RecipeArgs(model_args, data_args, training_args, finetuning_args)


#: recipe keys written from a setting of another name (the rest: algorithm.<key>, or an override)
SETTING_OF = {
    "model_name_or_path": "model_path",
    "template": "model_config.template",
    "default_system": "model_config.default_system",
    "enable_thinking": "model_config.chat_template_kwargs.enable_thinking",
    "image_min_pixels": "the model's image processor (preprocessor_config.json: size.shortest_edge)",
    "image_max_pixels": "the model's image processor (preprocessor_config.json: size.longest_edge)",
    "deepspeed": "launch.deepspeed",
    "disable_gradient_checkpointing": "algorithm.gradient_checkpointing",
    POLICY_GRADIENT: "algorithm.policy_gradient",
    CARRY: "algorithm.carry_optimizer",
}


def setting_of(key: str) -> str:
    """The Baton setting that writes recipe key `key` (an unknown key can only come from the overrides)."""
    if key in SETTING_OF:
        return SETTING_OF[key]
    if key in {f.name for f in fields(AlgorithmConfig)}:
        return f"algorithm.{key}"
    return f"algorithm.llamafactory_overrides.{key}"


def named_key(said: str, recipe: dict) -> str | None:
    """The recipe key an error message names: the longest key it spells (learning_rate, or "learning rate"
    as torch's optimizers write it), else the key of the first string value it quotes; None when neither."""

    def names(word: str) -> bool:
        return re.search(rf"(?<![\w/]){re.escape(word)}(?![\w/])", said) is not None

    key = next((k for k in sorted(recipe, key=len, reverse=True) if names(k) or names(k.replace("_", " "))), None)
    if key is None:
        key = next((k for k, v in recipe.items() if isinstance(v, str) and len(v) > 1 and names(v)), None)
    return key


def rejection(exc: BaseException | str, recipe: dict) -> str:
    """LLaMA-Factory's refusal of `recipe` as a Baton error: its words (`exc`, or the error line of a log),
    then the setting and value it names (`named_key`) and the fix."""
    said = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    key = named_key(said, recipe)
    text = f"LLaMA-Factory rejects the training YAML of this config: {said}\n"
    if key is None:
        return text + (
            "  fix the algorithm.* field or algorithm.llamafactory_overrides key with the value it names (or "
            "model_path when it names the model); docs/update.md, step 4, maps the fields to the YAML"
        )
    setting = setting_of(key)
    return text + (
        f"  field: {setting}={recipe[key]!r} (LLaMA-Factory's `{key}`)\n"
        f"  fix: set {setting} to a value LLaMA-Factory accepts (or remove algorithm.llamafactory_overrides.{key} "
        "when it is set there); docs/update.md, step 4, maps the fields to the YAML"
    )


def load_template(args: RecipeArgs) -> tuple[dict, Any]:
    """The model's tokenizer module and the chat template fixed for that tokenizer, as LLaMA-Factory trains."""
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    tokenizer_module = load_tokenizer(args.model)
    return tokenizer_module, get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], args.data)


def save_recipe(path: Path, recipe: dict) -> None:
    """Write the YAML atomically (OmegaConf renders plain YAML)."""
    from omegaconf import OmegaConf

    save_text(path, OmegaConf.to_yaml(OmegaConf.create(recipe)))
