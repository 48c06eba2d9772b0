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
