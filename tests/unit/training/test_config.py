"""configs/update.yaml composes with each algorithm; validate() reports every problem at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rollout_engine.errors import ConfigError
from training.chat_template import Choice
from training.config import UpdateConfig, register_configs, validate
from training.recipe import AUTOCAST_BF16, Device, build_recipe, check_deepspeed, deepspeed_file, precision
from training.selection import DPOSelector, GroupSelector, KTOSelector, RFTSelector

#: the template training.chat_template finds for the shipped model
CHOSEN = Choice("smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face")

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def load(tmp_path: Path, *overrides: str) -> UpdateConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("update", overrides=[f"log_path={tmp_path}", "iteration=0", f"model_path={tmp_path}", *overrides])
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize(
    ("algorithm", "stage", "selector"),
    [
        ("rft", "sft", RFTSelector),
        ("kto", "kto", KTOSelector),
        ("dpo", "dpo", DPOSelector),
        ("grpo", "sft", GroupSelector),
    ],
)
def test_each_algorithm_composes_and_instantiates(tmp_path: Path, algorithm: str, stage: str, selector) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = load(tmp_path, f"algorithm={algorithm}")
    validate(cfg)
    assert cfg.algorithm.stage == stage
    assert isinstance(instantiate(OmegaConf.structured(cfg.algorithm.selection)), selector)


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "algorithm.per_device_train_batch_size=0",
        "algorithm.warmup_ratio=0.1",
        "launch.node_rank=2",
        "algorithm.selection.shortest_per_task=-1",
    )
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    text = str(err.value)
    for needle in (
        "config.json missing",
        "per_device_train_batch_size must be >= 1 (got 0)",
        "warmup_steps and algorithm.warmup_ratio",
        "launch.node_rank must be in [0, launch.nnodes=1)",
        "algorithm.selection.shortest_per_task must be >= 0, 0 = every success (got -1)",
    ):
        assert needle in text


def test_grpo_carries_its_loss_to_the_trainer_and_refuses_what_it_cannot_train(tmp_path: Path) -> None:
    """The loss settings reach the recipe under Baton's own key (taken out before LLaMA-Factory parses it); a
    validation split and demonstrations have no advantage, and GroupSelector's rows mean nothing to rft."""
    from training.dataset import DatasetFiles
    from training.recipe import ONE_PROCESS_DROPPED, POLICY_GRADIENT

    (tmp_path / "config.json").write_text("{}")
    cfg = load(tmp_path, "algorithm=grpo", "algorithm.policy_gradient.kl_beta=0.01")
    recipe = build_recipe(cfg, DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN)
    assert recipe["stage"] == "sft" and recipe["mask_history"] is True and POLICY_GRADIENT in ONE_PROCESS_DROPPED
    assert recipe[POLICY_GRADIENT] == {
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token_mean",
        "kl_beta": 0.01,
        "old_logprobs": "rollout",
        "tis_cap": 2.0,
    }
    assert POLICY_GRADIENT not in build_recipe(
        load(tmp_path), DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN
    )
    episodes = DatasetFiles(tmp_path, 4, 0, episode_rows=True)  # rows of whole episodes: every reply trains
    assert build_recipe(cfg, episodes, tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN)["mask_history"] is False
    with pytest.raises(ConfigError, match=r"data\.episode_rows"):
        validate(load(tmp_path, "data.episode_rows=per_episode"))
    demo = tmp_path / "demonstrations.jsonl"
    demo.write_text("")
    with pytest.raises(ConfigError) as err:
        validate(load(tmp_path, "algorithm=grpo", "data.val_split_ratio=0.1", f"data.demonstrations={demo}"))
    assert "data.val_split_ratio=0.1 but algorithm=grpo has no validation loss" in str(err.value)
    assert "algorithm=grpo trains sampled episodes" in str(err.value)
    with pytest.raises(ConfigError, match="GroupSelector gives each row an advantage that only the policy-gradient"):
        validate(load(tmp_path, "algorithm.selection._target_=training.selection.GroupSelector"))
    with pytest.raises(ConfigError, match=r"algorithm\.policy_gradient replaces the loss of stage sft, not of 'kto'"):
        validate(load(tmp_path, "algorithm=grpo", "algorithm.stage=kto"))


def test_an_update_on_demonstrations_alone_is_a_valid_rft_setting(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    validate(load(tmp_path, "algorithm.selection.positive_samples_to_train=0"))
    with pytest.raises(ConfigError, match=r"positive_samples_to_train must be >= 0.* \(got -1\)"):
        validate(load(tmp_path, "algorithm.selection.positive_samples_to_train=-1"))


def test_unknown_choice_is_rejected_by_the_schema(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"launch\.deepspeed must be one of"):
        validate(load(tmp_path, "launch.deepspeed=zero9"))


def test_recipe_cpu_defaults_and_deepspeed_presets(tmp_path: Path) -> None:
    from training.dataset import DatasetFiles

    cfg = load(tmp_path, "algorithm=dpo", "algorithm.finetuning_type=lora")
    recipe = build_recipe(cfg, DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN)
    assert recipe["bf16"] is False and "deepspeed" not in recipe and recipe["stage"] == "dpo"
    assert "mask_history" not in recipe  # sft only
    assert recipe["lora_rank"] == 8 and recipe["pref_beta"] == 0.1 and recipe["dataset"] == "baton_train"
    assert deepspeed_file("auto", Device("cuda", 8)).name == "zero1.json"
    for preset in ("zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"):
        assert deepspeed_file(preset, Device("cpu", 1)).is_file()


GPU = Device("cuda", 1)
PRESETS = ("zero1", "zero2", "zero2_offload", "zero3", "zero3_offload")


@pytest.mark.parametrize("preset", ["auto", *PRESETS])
def test_deepspeed_in_bf16_keeps_fp32_parameters_through_torch_autocast(preset: str) -> None:
    """DeepSpeed's bf16 mode saves bf16 weights (its fp32 master weights live in the optimizer state): a bf16
    fine-tune under DeepSpeed computes through DeepSpeed's torch_autocast instead, on fp32 parameters, with
    HF's bf16 off (it would turn DeepSpeed's bf16 mode back on); everything else is the preset's."""
    bf16, ds = precision(None, preset, GPU, "full")
    preset_file = deepspeed_file(preset, GPU)
    assert bf16 is False and ds is not None and preset_file is not None
    assert ds["torch_autocast"] == AUTOCAST_BF16 == {"enabled": True, "dtype": "bfloat16"}
    assert ds["bf16"] == {"enabled": False} and ds["fp16"]["enabled"] == "auto"
    assert {k: v for k, v in ds.items() if k not in ("bf16", "torch_autocast")} == {
        k: v for k, v in json.loads(preset_file.read_text()).items() if k != "bf16"
    }
    if preset != "auto":  # auto is no DeepSpeed on a CPU; bf16 asked for there is the same config
        assert precision(True, preset, Device("cpu", 1), "freeze") == (False, ds)


@pytest.mark.parametrize(
    ("bf16", "preset", "device", "finetuning_type", "recipe_bf16", "autocast"),
    [
        (None, "none", GPU, "full", True, None),  # no DeepSpeed: HF's autocast, the model's own fp32 params
        (None, "auto", Device("cpu", 1), "full", False, None),  # CPU: no DeepSpeed, fp32
        (None, "zero2", Device("cpu", 1), "full", False, False),  # CPU: DeepSpeed in fp32
        (False, "zero1", GPU, "full", False, False),  # fp32 asked for on a GPU
        (None, "zero1", GPU, "lora", True, False),  # a LoRA: the base is frozen, DeepSpeed's bf16 mode
        (None, "zero3", Device("cuda", 8), "full", False, True),
    ],
)
def test_precision_is_a_function_of_the_device_and_the_preset(
    bf16, preset: str, device: Device, finetuning_type: str, recipe_bf16: bool, autocast
) -> None:
    got_bf16, ds = precision(bf16, preset, device, finetuning_type)
    assert got_bf16 is recipe_bf16
    if autocast is None:
        assert ds is None
    else:
        assert ("torch_autocast" in ds) is autocast and ds["bf16"]["enabled"] == ("auto" if not autocast else False)


def test_the_gpu_recipe_carries_the_autocast_config(tmp_path: Path) -> None:
    from training.dataset import DatasetFiles

    files = DatasetFiles(tmp_path, 4, 0)
    recipe = build_recipe(load(tmp_path), files, tmp_path, tmp_path / "out", GPU, CHOSEN)
    assert recipe["bf16"] is False and recipe["deepspeed"]["zero_optimization"]["stage"] == 1
    assert recipe["deepspeed"]["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    plain = build_recipe(load(tmp_path, "launch.deepspeed=none"), files, tmp_path, tmp_path / "out", GPU, CHOSEN)
    assert plain["bf16"] is True and "deepspeed" not in plain
    lora = build_recipe(
        load(tmp_path, "algorithm.finetuning_type=lora"), files, tmp_path, tmp_path / "out", GPU, CHOSEN
    )
    assert lora["bf16"] is True and lora["deepspeed"]["bf16"] == {"enabled": "auto"}
    assert "torch_autocast" not in lora["deepspeed"]


@pytest.mark.parametrize(("setting", "disabled"), [("false", True), ("true", False)])
def test_recipe_honours_gradient_checkpointing_both_ways(tmp_path: Path, setting: str, disabled: bool) -> None:
    """LLaMA-Factory checkpoints unless `disable_gradient_checkpointing: true`; HF's own key would do nothing."""
    from training.dataset import DatasetFiles

    cfg = load(tmp_path, f"algorithm.gradient_checkpointing={setting}")
    recipe = build_recipe(cfg, DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN)
    assert recipe["disable_gradient_checkpointing"] is disabled and "gradient_checkpointing" not in recipe


def test_a_refusal_of_llamafactory_names_the_setting_its_value_and_the_fix() -> None:
    """LLaMA-Factory's messages name a key (HfArgumentParser) or a value (transformers' enums); the error
    names the Baton setting behind it."""
    from training.recipe import rejection

    recipe = {"save_strategy": "no", "lr_scheduler_type": "bogus", "no_such_key": 1, "deepspeed": "/z.json"}
    bad_value = rejection(ValueError("bogus is not a valid SchedulerType, please select one of ['linear']"), recipe)
    assert "  field: algorithm.lr_scheduler_type='bogus' (LLaMA-Factory's `lr_scheduler_type`)" in bad_value
    assert "  fix: set algorithm.lr_scheduler_type to a value LLaMA-Factory accepts" in bad_value
    unknown = rejection(ValueError("Some keys are not used by the HfArgumentParser: ['no_such_key']"), recipe)
    assert "field: algorithm.llamafactory_overrides.no_such_key=1" in unknown
    unnamed = rejection(ValueError("Please launch distributed training with `llamafactory-cli` or `torchrun`."), recipe)
    assert "field:" not in unnamed and "fix the algorithm.* field or algorithm.llamafactory_overrides key" in unnamed


def test_check_deepspeed_names_the_preset_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from training import recipe

    assert check_deepspeed("auto", Device("cpu", 1)) == [] and check_deepspeed("none", Device("cuda", 1)) == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    (problem,) = check_deepspeed("auto", Device("cuda", 1))
    assert problem == (
        "launch.deepspeed='auto' (zero1 on cuda) needs the deepspeed package, which this environment lacks; "
        "set launch.deepspeed=none"
    )
    monkeypatch.setattr(recipe, "DEEPSPEED_DIR", tmp_path)
    (tmp_path / "zero1.json").write_text("{}")
    (problem,) = check_deepspeed("zero2", Device("cpu", 1))
    missing = tmp_path / "zero2.json"
    assert problem == f"launch.deepspeed='zero2': {missing} does not exist; set launch.deepspeed to one of: none, zero1"


def test_phase_check_needs_llamafactory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from training.update import run_update

    (tmp_path / "config.json").write_text("{}")
    cfg = load(tmp_path, "phase=check")
    validate(cfg)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"phase=check needs LLaMA-Factory: run it with the train environment's"):
        run_update(cfg, Device("cpu", 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # nothing written


def test_trackers_reach_llamafactory_through_report_to_and_the_environment(tmp_path: Path) -> None:
    from training.dataset import DatasetFiles
    from training.recipe import tracker_env

    plain = load(tmp_path)
    assert (
        build_recipe(plain, DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path, Device("cpu", 1), CHOSEN)["report_to"]
        == "none"
    )
    assert tracker_env(plain, tmp_path / "iter_0000") == {}
    cfg = load(tmp_path, "tracker=[tensorboard,wandb]", "tracker.wandb.project=p")
    recipe = build_recipe(cfg, DatasetFiles(tmp_path, 4, 0), tmp_path, tmp_path / "out", Device("cpu", 1), CHOSEN)
    assert recipe["report_to"] == ["tensorboard", "wandb"] and recipe["run_name"] == "iter_0000"
    env = tracker_env(cfg, tmp_path / "iter_0000")
    assert env["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "iter_0000" / "tensorboard")
    assert env["WANDB_DIR"] == str(tmp_path / "iter_0000") and env["WANDB_MODE"] == "offline"
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_RUN_GROUP"] == tmp_path.name


def test_a_bad_wandb_mode_names_the_field_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tracker\.wandb\.mode must be offline or online \(got 'onlin'\)"):
        validate(load(tmp_path, "tracker=wandb", "tracker.wandb.mode=onlin"))


def test_a_vision_language_recipe_resizes_images_as_the_models_processor_does(tmp_path: Path) -> None:
    """LLaMA-Factory's default image_max_pixels (589,824) shrinks a 1280x800 screenshot to 570 Qwen3-VL tokens
    where vLLM, with the model's processor settings, makes 1,000: the recipe carries the model's."""
    from training.dataset import DatasetFiles

    files, cpu = DatasetFiles(tmp_path, 4, 0), Device("cpu", 1)
    size = {"shortest_edge": 65536, "longest_edge": 16777216}
    nested, flat, text = tmp_path / "nested", tmp_path / "flat", tmp_path / "text"
    for folder in (nested, flat, text):
        folder.mkdir()
    # transformers 5 saves the image processor inside processor_config.json; Qwen's Hub folders keep it apart
    (nested / "processor_config.json").write_text(json.dumps({"image_processor": {"size": size}}))
    (flat / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056}))
    recipes = [build_recipe(load(tmp_path), files, m, tmp_path / "out", cpu, CHOSEN) for m in (nested, flat, text)]
    assert (recipes[0]["image_min_pixels"], recipes[0]["image_max_pixels"]) == (65536, 16777216)
    assert (recipes[1]["image_min_pixels"], recipes[1]["image_max_pixels"]) == (3136, 12845056)
    assert "image_max_pixels" not in recipes[2]
