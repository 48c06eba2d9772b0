"""The LLaMA-Factory training YAML, generated from `algorithm` (saved beside the dataset).

    recipe = build_recipe(cfg, files, model, output_dir, device)   # a dict
    save_recipe(path, recipe)

Every hyperparameter of `AlgorithmConfig` maps to the LLaMA-Factory key of the
same name; `llamafactory_overrides` is merged last. The DeepSpeed preset is a
file under configs/deepspeed/ (`auto`: none on CPU, ZeRO-1 on GPU). bf16
`null` means bf16 on GPU and fp32 on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_engine.files import save_text
from training.config import AlgorithmConfig, UpdateConfig
from training.dataset import DatasetFiles

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
    "gradient_checkpointing",
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


@dataclass(frozen=True)
class Device:
    """Where training runs: `cuda` with `count` GPUs, or `cpu` (count 1 process)."""

    kind: str
    count: int


def deepspeed_file(preset: str, device: Device) -> Path | None:
    """The DeepSpeed JSON for `preset` (None = no DeepSpeed)."""
    if preset == "auto":
        preset = "zero1" if device.kind == "cuda" else "none"
    return None if preset == "none" else DEEPSPEED_DIR / f"{preset}.json"


def build_recipe(cfg: UpdateConfig, files: DatasetFiles, model: Path, output_dir: Path, device: Device) -> dict:
    """The LLaMA-Factory YAML as a dict."""
    alg: AlgorithmConfig = cfg.algorithm
    train_name, val_name = files.names
    recipe: dict[str, Any] = {
        "model_name_or_path": str(model),
        "trust_remote_code": True,
        "do_train": True,
        "dataset": train_name,
        "dataset_dir": str(files.directory),
        "template": cfg.template,
        **({"default_system": cfg.default_system} if cfg.default_system is not None else {}),
        "output_dir": str(output_dir),
        "overwrite_output_dir": True,
        "overwrite_cache": True,
        "save_strategy": "no" if alg.save_only_model else "epoch",
        "report_to": "none",
        "plot_loss": False,
        "bf16": alg.bf16 if alg.bf16 is not None else device.kind == "cuda",
    }
    recipe |= {key: getattr(alg, key) for key in HYPERPARAMETERS if getattr(alg, key) is not None}
    if alg.stage != "sft":  # LLaMA-Factory refuses mask_history outside sft (kto/dpo train the reply only)
        recipe.pop("mask_history")
    if alg.finetuning_type == "lora":
        recipe |= {key: getattr(alg, key) for key in LORA_KEYS}
    recipe |= {key: getattr(alg, key) for key in PREF_KEYS.get(alg.stage, ())}
    if val_name:
        recipe |= {"eval_dataset": val_name, "eval_strategy": "epoch", "do_eval": True}
    ds = deepspeed_file(cfg.launch.deepspeed, device)
    if ds is not None:
        recipe["deepspeed"] = str(ds)
    recipe |= dict(alg.llamafactory_overrides)
    return recipe


def save_recipe(path: Path, recipe: dict) -> None:
    """Write the YAML atomically (OmegaConf renders plain YAML)."""
    from omegaconf import OmegaConf

    save_text(path, OmegaConf.to_yaml(OmegaConf.create(recipe)))
