"""Building the run's parts from a validated `RolloutConfig`.

`build_env` is the one place an environment is made: Hydra instantiates
`cfg.env` as a partial (its `_target_` class with the YAML parameters), then
the engine calls it with `context=RunContext(...)`. Unknown targets and
unknown parameters become a `ConfigError` naming the key.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from rollout_engine.config import RolloutConfig
from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env
from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout


def build_context(cfg: RolloutConfig) -> RunContext:
    return RunContext(
        split=cfg.split,
        iteration=cfg.iteration,
        rank=cfg.rank,
        seed=cfg.seed,
        data_path=Path(cfg.data_path),
        log_dir=Layout(cfg.log_path).iteration_dir(cfg.split, cfg.iteration),
        step_budget=cfg.env_config.step_budget(cfg.split),
        judge=cfg.openai_config,
        policy=cfg.policy_config,
        model=cfg.model_config,
    )


def build_env(cfg: RolloutConfig, context: RunContext | None = None) -> Env:
    """Instantiate the environment chosen by `cfg.env._target_` with its parameters and the run context."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    target = OmegaConf.select(cfg.env, "_target_", default="")
    fix = "choose a file of configs/env/ (env=reasoning_gym, env=judged, ...) or a class deriving from Env"
    try:
        factory = instantiate(cfg.env, _partial_=True, _convert_="all")
    except InstantiationException as exc:
        raise ConfigError(f"env._target_ cannot be loaded (got {target!r}: {exc}); {fix}") from None
    try:
        env = factory(context=context or build_context(cfg))
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            keys = sorted(k for k in cfg.env if k != "_target_")
            raise ConfigError(
                f"env has a parameter {target} does not take ({exc}); got keys {keys}; remove it or fix its spelling"
            ) from None
        given = {k: v for k, v in OmegaConf.to_container(cfg.env).items() if k != "_target_"}
        raise ConfigError(
            f"env has a value of the wrong type for {target} ({exc}); got {given}; give each parameter the type "
            "its configs/env/ file shows (a number, not text)"
        ) from None
    if not isinstance(env, Env):
        raise ConfigError(f"env._target_ must name an Env subclass (got {target!r}); {fix}")
    return env
