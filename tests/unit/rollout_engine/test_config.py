"""Config validation messages, every YAML composes, every _target_ instantiates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rollout_engine.build import build_env
from rollout_engine.config import register_configs, validate
from rollout_engine.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
BASE = ["data_path=/data", "log_path=/logs"]


def composed(name: str, overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(name, overrides=overrides)


def test_every_problem_reported_at_once_with_field_value_and_fix() -> None:
    cfg = composed(
        "rollout_train",
        ["env_config.server_size=0", "policy_config.top_p=2", "rank=3", "policy_config.base_url=localhost:8000"],
    )
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    text = str(err.value)
    assert "data_path is required" in text and "log_path is required" in text
    assert "env_config.server_size must be >= 1 (got 0)" in text
    assert "policy_config.top_p must be in (0, 1] (got 2.0)" in text
    assert "policy_config.base_url must start with http:// or https:// (got 'localhost:8000')" in text


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match=r"rank must be < len\(rank_weights\) = 2 \(got 2\)"):
        validate(composed("rollout_train", [*BASE, "rank=2", "rank_weights=[1,1]"]))
    with pytest.raises(ConfigError, match="difficulty_ratio must define buckets"):
        validate(composed("rollout_train", [*BASE, "env_config.train_tasks_sampler=ratio"]))


def test_a_takeover_plan_needs_several_ranks() -> None:
    with pytest.raises(
        ConfigError, match=r"takeover_plan needs several ranks \(got 'p.json' with rank_weights=\[1.0\]\)"
    ):
        validate(composed("rollout_train", [*BASE, "takeover_plan=p.json"]))
    assert validate(composed("rollout_train", [*BASE, "rank_weights=[1,1]", "takeover_plan=p.json"])).takeover_plan


def test_limits_scope_is_node_or_cluster_and_a_cluster_limit_covers_every_rank() -> None:
    assert validate(composed("rollout_train", BASE)).env_config.limits_scope == "node"
    with pytest.raises(ConfigError, match=r"env_config.limits_scope must be node or cluster \(got 'global'\)"):
        validate(composed("rollout_train", [*BASE, "env_config.limits_scope=global"]))
    cluster = [*BASE, "env_config.limits_scope=cluster", "rank_weights=[1,1,1]", "env_config.server_size=2"]
    with pytest.raises(ConfigError, match=r"env_config.server_size must be >= 3 with env_config.limits_scope=cluster"):
        validate(composed("rollout_train", cluster))
    validate(composed("rollout_train", [*cluster[:-1], "env_config.server_size=3"]))


@pytest.mark.parametrize("name", ["rollout_train", "rollout_test"])
@pytest.mark.parametrize("env", sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml")))
def test_every_env_yaml_composes_and_instantiates(name: str, env: str) -> None:
    # custom is for a class of the user's own: its _target_ is theirs to give (here: the engine tests' echo)
    own = ["env._target_=tests.unit.rollout_engine.engine_fakes.EchoEnv"] if env == "custom" else []
    built = build_env(validate(composed(name, [*BASE, f"env={env}", *own])))
    assert built.name == ("echo" if env == "custom" else env)


def test_env_custom_needs_a_target_and_passes_no_other_env_s_parameters() -> None:
    with pytest.raises(ConfigError, match=r"env\._target_ must name the environment's class \(got nothing\)"):
        validate(composed("rollout_train", [*BASE, "env=custom"]))
    cfg = composed("rollout_train", [*BASE, "env=custom", "env._target_=my.Env", "+env.level=3"])
    assert dict(cfg.env) == {"_target_": "my.Env", "level": 3}


def test_unknown_env_parameter_and_target_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unexpected keyword argument 'answer_rul'"):
        build_env(validate(composed("rollout_test", [*BASE, "+env.answer_rul=tag"])))
    with pytest.raises(ConfigError, match=r"env\._target_ cannot be imported \(got 'nowhere\.Env'"):
        build_env(validate(composed("rollout_test", [*BASE, "env._target_=nowhere.Env"])))
    with pytest.raises(ConfigError, match=r"env\.answer_rule must be one of .* \(got 'middle'\)"):
        build_env(validate(composed("rollout_test", [*BASE, "env.answer_rule=middle"])))


def test_an_env_parameter_of_the_wrong_type_is_named_as_such_not_as_an_unknown_parameter() -> None:
    with pytest.raises(ConfigError) as caught:
        build_env(validate(composed("rollout_train", [*BASE, "env=miniwob", "env.settle_ms=abc"])))
    (problem,) = caught.value.problems
    assert "a value of the wrong type" in problem and "'settle_ms': 'abc'" in problem, problem
    assert "remove it or fix its spelling" not in problem


@pytest.mark.parametrize(
    ("name", "greedy", "expected"), [("rollout_test", "true", 0.0), ("rollout_train", "true", 0.7)]
)
def test_greedy_held_out_sampling_changes_the_test_rollout_only(name: str, greedy: str, expected: float) -> None:
    from omegaconf import OmegaConf

    from rollout_engine.runner import sampling_config

    cfg = composed(name, [*BASE, "policy_config.temperature=0.7", f"env_config.test_greedy={greedy}"])
    assert sampling_config(OmegaConf.to_object(cfg)).temperature == expected


# --- vllm_config: the policy server's settings (docs/serving.md) ------------------------------------------------


def test_vllm_config_defaults_are_auto_and_compose() -> None:
    vllm = validate(composed("rollout_train", BASE)).vllm_config
    assert (vllm.max_model_len, vllm.tensor_parallel_size, vllm.data_parallel_size) == (0, 1, 0)
    assert (vllm.gpu_memory_utilization, vllm.limit_mm_per_prompt, vllm.extra_args) == (0.85, {}, [])
    assert vllm.allowed_local_media_path == "auto"


def test_the_reference_s_vllm_command_as_overrides() -> None:
    reference = [
        "vllm_config.max_model_len=32768",
        "vllm_config.gpu_memory_utilization=0.95",
        "vllm_config.tensor_parallel_size=1",
        "+vllm_config.limit_mm_per_prompt={video:0}",  # the + : the dict is empty (Hydra adds its keys)
        "vllm_config.extra_args=[--max-num-seqs,512]",
    ]
    vllm = validate(composed("rollout_train", [*BASE, *reference])).vllm_config
    assert (vllm.max_model_len, vllm.gpu_memory_utilization, vllm.limit_mm_per_prompt) == (32768, 0.95, {"video": 0})
    assert vllm.extra_args == ["--max-num-seqs", "512"]


@pytest.mark.parametrize(
    ("flag", "setting"),
    [
        ("--max-model-len", "vllm_config.max_model_len"),
        ("--max_model_len=4096", "vllm_config.max_model_len"),
        ("-tp", "vllm_config.tensor_parallel_size"),
        ("--data-parallel-size=2", "vllm_config.data_parallel_size"),
        ("--device-memory-utilization", "vllm_config.gpu_memory_utilization"),
        ("--limit-mm-per-prompt.video", "vllm_config.limit_mm_per_prompt"),
        ("--port", "BATON_VLLM_PORT"),
        ("--dtype", "BATON_VLLM_DTYPE"),
        ("--served-model-name", "policy_config.model"),
    ],
)
def test_extra_args_may_not_set_what_a_setting_or_run_sh_sets(flag: str, setting: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(composed("rollout_train", [*BASE, f"vllm_config.extra_args=['{flag}','4']"]))
    named = flag.split("=")[0].split(".")[0].replace("_", "-")
    assert f"vllm_config.extra_args must not set {named} (got '{flag}'): " in str(err.value)
    assert setting in str(err.value)


def test_media_path_and_multimodal_limits_are_checked() -> None:
    with pytest.raises(ConfigError) as err:
        validate(
            composed(
                "rollout_train",
                [*BASE, "vllm_config.allowed_local_media_path=logs", "+vllm_config.limit_mm_per_prompt={image:-1}"],
            )
        )
    text = str(err.value)
    assert "vllm_config.allowed_local_media_path must be auto, '' or an absolute path (got 'logs')" in text
    assert "vllm_config.limit_mm_per_prompt.image must be >= 0 (got -1)" in text


def test_max_new_tokens_must_leave_room_for_a_prompt_in_the_context() -> None:
    """policy_config.max_new_tokens=8192 with a 2048-token context is refused naming both settings; an auto
    context is checked by run.sh once it is resolved for the node (coordinator/driver/vllm_settings.py)."""
    long = [*BASE, "policy_config.max_new_tokens=8192"]
    with pytest.raises(ConfigError) as err:
        validate(composed("rollout_train", [*long, "vllm_config.max_model_len=2048"]))
    assert str(err.value) == (
        "policy_config.max_new_tokens must leave at least 256 tokens of vllm_config.max_model_len for the prompt "
        "(got 8192 of 2048); lower policy_config.max_new_tokens to <= 1792, or raise vllm_config.max_model_len "
        "to >= 8448"
    )
    validate(composed("rollout_train", long))  # auto: checked when resolved
    validate(composed("rollout_train", [*BASE, "policy_config.max_new_tokens=1792", "vllm_config.max_model_len=2048"]))
