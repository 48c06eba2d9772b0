"""Building the run's parts from a validated `RolloutConfig`.

`build_env` is the one place an environment is made, in the driver's checks
(coordinator/overrides.py) and in every rollout alike: the folders of
`env_config.python_path` go on the import path, the `_target_` class is
imported and must derive from `Env`, then Hydra instantiates `cfg.env` as a
partial (the class with the YAML parameters) and the engine calls it with
`context=RunContext(...)`. A target that cannot be imported, a class that is
no `Env`, and unknown parameters become a `ConfigError` naming the key, the
value and the fix.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType

from omegaconf import OmegaConf

from rollout_engine.config import RolloutConfig
from rollout_engine.context import RunContext
from rollout_engine.envs.base import Env
from rollout_engine.errors import ConfigError
from rollout_engine.layout import Layout

#: the repository: the folders of env_config.python_path go after it on sys.path, so they never shadow Baton
REPO = Path(__file__).resolve().parents[1]
#: where a target that cannot be imported can come from
IMPORT_FIX = (
    "put the folder that holds its package in env_config.python_path=[/abs/folder] (or on PYTHONPATH), "
    "or install the package into the app environment ($BATON_APP_PY -m pip install DIR), "
    "or choose a file of configs/env/ (env=reasoning_gym, ...; docs/environments.md)"
)


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


def add_python_path(cfg: RolloutConfig) -> list[str]:
    """Put the folders of `env_config.python_path` (relative ones under data_path) on sys.path right after the
    repository (before the installed packages), each once; return them. A folder that is not there is a
    ConfigError naming its index, the value and the fix."""
    folders, problems = [], []
    for index, entry in enumerate(cfg.env_config.python_path):
        folder = (Path(cfg.data_path) / Path(entry).expanduser()).resolve()  # an absolute entry stays itself
        if folder.is_dir():
            folders.append(str(folder))
            continue
        shown = entry if Path(entry).expanduser().is_absolute() else f"{entry} (under data_path: {folder})"
        problems.append(
            f"env_config.python_path[{index}] is not a folder (got {shown!r}); give the folder that holds your "
            "environment's package (for env._target_=my_envs.guess.GuessNumberEnv the folder with my_envs/ in it)"
        )
    if problems:
        raise ConfigError(problems)
    on_path = [Path(p).resolve() if p else None for p in sys.path]
    position = on_path.index(REPO) + 1 if REPO in on_path else 0
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(position, folder)
    return folders


def load_env_class(target: str) -> type[Env]:
    """The class `target` names (module.Class), imported; a ConfigError naming env._target_ unless it is a
    concrete Env subclass."""
    module_name, _, name = target.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"env._target_ must be a dotted path module.Class (got {target!r}); "
            "e.g. env._target_=my_envs.guess.GuessNumberEnv, or choose a file of configs/env/ (env=reasoning_gym)"
        )
    module = _import_module(target, module_name)
    found = getattr(module, name, None)
    if found is None:
        envs = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and issubclass(v, Env) and v is not Env)
        raise ConfigError(
            f"env._target_ names no class of module {module_name!r} (got {target!r}); fix the spelling "
            f"(its Env classes: {', '.join(envs) or 'none'})"
        )
    if not (inspect.isclass(found) and issubclass(found, Env)):
        what = "a class that does not" if inspect.isclass(found) else f"a {type(found).__name__}"
        raise ConfigError(
            f"env._target_ must name a class deriving from rollout_engine.envs.base.Env (got {target!r}, {what}); "
            "subclass Env and override its hooks (docs/environments.md)"
        )
    if inspect.isabstract(found):
        missing = ", ".join(sorted(found.__abstractmethods__))
        raise ConfigError(
            f"env._target_ names an abstract class (got {target!r}, which does not define {missing}); "
            "add them to the class (Env's hooks: setup_state, initial_messages, env_response, score)"
        )
    return found


def _import_module(target: str, module_name: str) -> ModuleType:
    """The module of env._target_, imported; a ConfigError saying why it cannot be (not found: where to put it;
    a module it imports is missing, or it raised: what and where)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing, top = exc.name or "", module_name.partition(".")[0]
        if not (module_name == missing or module_name.startswith(missing + ".")):  # something the module imports
            raise ConfigError(_import_failed(target, module_name, exc, "install it into the app environment")) from None
        if missing != top and top in sys.modules:  # the package is there, not the module
            folder = next(iter(getattr(sys.modules[top], "__path__", [])), "?")
            raise ConfigError(
                f"env._target_ cannot be imported (got {target!r}: no module named {missing!r}, though the "
                f"package {top!r} is at {folder}); fix the spelling"
            ) from None
        raise ConfigError(
            f"env._target_ cannot be imported (got {target!r}: no module named {missing!r}); {IMPORT_FIX}"
        ) from None
    except Exception as exc:  # the user's module raised while it was imported (a syntax error, a bug)
        raise ConfigError(_import_failed(target, module_name, exc, "fix the module")) from None


def _import_failed(target: str, module_name: str, exc: Exception, fix: str) -> str:
    """The error of a module that exists but raised while imported: what it raised, where, and the fix."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" at {exc.filename}:{exc.lineno}"
    return (
        f"env._target_ cannot be imported (got {target!r}: importing {module_name!r} raised "
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}); {fix}"
    )


def build_env(cfg: RolloutConfig, context: RunContext | None = None) -> Env:
    """Instantiate the environment chosen by `cfg.env._target_` with its parameters and the run context."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    target = str(OmegaConf.select(cfg.env, "_target_", default=""))
    add_python_path(cfg)
    load_env_class(target)
    try:
        factory = instantiate(cfg.env, _partial_=True, _convert_="all")
    except InstantiationException as exc:
        raise ConfigError(f"env._target_ cannot be loaded (got {target!r}: {exc}); {IMPORT_FIX}") from None
    try:
        env = factory(context=context or build_context(cfg))
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            keys = sorted(k for k in cfg.env if k != "_target_")
            raise ConfigError(
                f"env has a parameter {target} does not take ({exc}); got keys {keys}; remove it or fix its "
                "spelling (a class of your own starts from no parameters with env=custom)"
            ) from None
        given = {k: v for k, v in OmegaConf.to_container(cfg.env).items() if k != "_target_"}
        raise ConfigError(
            f"env has a value of the wrong type for {target} ({exc}); got {given}; give each parameter the type "
            "its configs/env/ file shows (a number, not text)"
        ) from None
    return env
