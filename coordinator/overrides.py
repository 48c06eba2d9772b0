"""Route run.sh's Hydra overrides to the rollout and update configs, and validate them by composing once.

    routed = route_and_compose(Request(data_path, log_path, base_model, overrides, debug_mode))
    routed.rollout, routed.update      # the overrides each config receives
    routed.resolved                    # {"rollout_train": ..., "rollout_test": ..., "update": ...}

An override goes to every config that has its key (`env_config.*` to the
rollouts, `algorithm.*` to the update, a key both have to both); a key added
under a node (`+env.max_guesses=6`) goes where that node is; any other key neither
has is tried on each (with the group choices given, so that `tracker=wandb
tracker.wandb.mode=online` routes) and must be accepted by one. A choice a config
group (a folder under configs/) lacks is refused naming the group's options. Keys that run.sh sets itself
are refused, as is an external `policy_config.base_url` without --debug-mode.
Every problem is collected into one `ConfigError`. A node file's `vllm_config` for this
rank (`Request.vllm`) is merged into the rollout configs after the overrides: it wins over them
on its ranks. With `rollout_splits`, a config
that composes is then checked as its rollout checks it before it starts
(rollout_engine.runner.prepare, less the policy server): the task file, the
environment's parameters and its word on each task.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rollout_engine.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")
#: keys run.sh sets for each phase, with the flag that sets them
RESERVED = {
    "data_path": "--data-path",
    "log_path": "--log-path",
    "iteration": "the iteration counter",
    "split": "--rollout-split",
    "rank": "--master/--worker",
    "rank_weights": "--rank-weights",
    "resume": "--resume",
    "policy_version": "the promoted policy",
    "takeover_plan": "--on-rank-failure continue",
    "model_path": "the served policy",
    "phase": "--rl-phase",
    "launch.nnodes": "--num-nodes",
    "launch.node_rank": "--master/--worker",
    "revert": "--keep-best",  # and every key under it
}
DEBUG_ONLY = ("policy_config.base_url",)
_MISSING = object()


@dataclass
class Request:
    """What run.sh knows before composing."""

    data_path: str
    log_path: str
    base_model: str
    overrides: list[str]
    debug_mode: bool = False
    #: this node's rank and every rank's load weight (a Hydra list, e.g. "[2,1]"), as run.sh passes them
    rank: int = 0
    rank_weights: str = "[1]"
    num_nodes: int = 1
    #: the splits this run rolls out (train, test): their task files and environment are checked too
    rollout_splits: tuple[str, ...] = ()
    #: this rank's node-file vllm_config (coordinator/nodefile.py), merged over the overrides
    vllm: dict[str, Any] = field(default_factory=dict)


@dataclass
class Routed:
    """The overrides of each config and the resolved configs."""

    rollout: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)
    resolved: dict[str, Any] = field(default_factory=dict)
    policy_base_url: str = ""
    policy_model: str = ""
    #: the most model requests a rollout of this rank keeps in flight (this node's KV cache is sized for them)
    max_sessions: int = 0
    #: the rollouts' vllm_config (rollout_engine.config.VllmConfig; the same in both) and the longest reply
    #: either asks for (policy_config.max_new_tokens)
    vllm: Any = None
    max_new_tokens: int = 0


def override_key(override: str) -> str:
    """`+a.b=1` -> `a.b`; `~a.b` -> `a.b`; `env=textworld` -> `env`."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def _compose(name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def _base(req: Request) -> dict[str, list[str]]:
    rollout = [f"data_path={req.data_path}", f"log_path={req.log_path}", "iteration=1"]
    rollout += [f"rank={req.rank}", f"rank_weights={req.rank_weights}"]
    update = [f"log_path={req.log_path}", "iteration=1", f"model_path={req.base_model}"]
    update += [f"launch.nnodes={req.num_nodes}", f"launch.node_rank={req.rank}"]
    return {"rollout": rollout, "update": update}


def group_options(group: str) -> list[str]:
    """The options of a config group (a folder of YAML files under configs/); [] when `group` is none."""
    folder = Path(CONFIG_DIR) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if "/" not in group and folder.is_dir() else []


def unknown_option(override: str) -> str | None:
    """The problem with `group=choice` (or `group=[a,b]`) naming a choice the group lacks; None when fine."""
    key, _, value = override.partition("=")
    options = group_options(key.strip()) if not override.startswith(("+", "~")) else []
    chosen = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
    bad = [v for v in chosen if v not in options]
    if not options or not bad:
        return None
    return (
        f"override {override!r}: configs/{key}/ has no {', '.join(map(repr, bad))}; choose one of {', '.join(options)}"
    )


def unparsable(override: str) -> str | None:
    """The problem with an override Hydra's grammar cannot parse (`a=[1`); None when it parses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException as exc:
        why = str(exc).splitlines()[0]
        return (
            f"override {override!r} is not a Hydra override ({why}); "
            "write key=value and quote a value with brackets, e.g. 'key=\"[1\"'"
        )
    return None


def hydra_problem(exc: Exception) -> str:
    """One line for a Hydra/OmegaConf composition error: what Hydra says, its cause, and the fix (Hydra's own
    when it gives one: a + to add keys to a dict, which an override without it cannot)."""
    cause = exc.__cause__ or exc.__context__
    lines = str(exc).splitlines()
    why = lines[0]
    if cause is not None and str(cause):
        why += f": {str(cause).splitlines()[0]}"
    hint = next((line for line in lines[1:] if line.startswith("To append to your config use +")), "")
    if hint:
        return f"{why}; to add keys to it, use +{hint.removeprefix('To append to your config use +')}"
    return f"{why}; give that key a value of its type, or drop the override"


def _has_key(cfg: DictConfig, key: str) -> bool:
    return OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False) is not _MISSING


def closed_parent(plain: dict[str, DictConfig], key: str) -> str | None:
    """The problem with `+key=...` adding a key where no new key belongs (None when it may): a new key goes
    only under an open mapping (env.*, env_config.difficulty_ratio, model_config.chat_template_kwargs,
    algorithm.llamafactory_overrides), never beside a schema's fields, where nothing would read it."""
    parts = key.split(".")
    # the deepest part of the key that exists, and the first name under it that does not
    depth = max(d for d in range(len(parts)) if d == 0 or any(_has_key(c, ".".join(parts[:d])) for c in plain.values()))
    parent, missing = ".".join(parts[:depth]), parts[depth]
    for cfg in plain.values():
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) in (dict, None):
            return None
    rest = ".".join(parts[depth:])
    paths = sorted({p for cfg in plain.values() for p in _paths(cfg)})
    near = [p for p in paths if p.rsplit(".", 1)[-1] == missing] or [
        p
        for p in paths
        if p.rpartition(".")[0] == parent
        and p.rsplit(".", 1)[-1]
        in difflib.get_close_matches(
            missing, [q.rsplit(".", 1)[-1] for q in paths if q.rpartition(".")[0] == parent], n=3
        )
    ]
    hint = f"did you mean {' or '.join('+' + p + rest[len(missing) :] for p in near[:3])}? " if near else ""
    where = f"{parent!r}" if parent else "the top level"
    return (
        f"override '+{key}=...': {where} has no key {missing!r} and takes no new ones (nothing would read it); "
        f"{hint}check the spelling, or drop the override (docs/rollout.md and docs/update.md list every key)"
    )


def _paths(cfg: DictConfig, prefix: str = "", depth: int = 3) -> list[str]:
    """Every dotted key of `cfg` down to `depth` levels."""
    out = []
    for name in cfg:
        path = f"{prefix}{name}"
        out.append(path)
        child = cfg._get_node(name)
        if depth > 1 and isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            out += _paths(child, path + ".", depth - 1)
    return out


def _accepts(name: str, base: list[str], override: str) -> bool:
    try:
        _compose(name, [*base, override])
    except Exception:  # any composition error means: not this config
        return False
    return True


def route(req: Request) -> tuple[Routed, list[str]]:
    """Assign each override to the configs that take it; return the problems found."""
    base = _base(req)
    plain = {"rollout": _compose("rollout_train", base["rollout"]), "update": _compose("update", base["update"])}
    routed, problems = Routed(), []
    # group choices (tracker=wandb) per config: a key such a choice adds (tracker.wandb.mode) is tried with them
    chosen = {
        t: [o for o in req.overrides if "." not in override_key(o) and _has_key(cfg, override_key(o))]
        for t, cfg in plain.items()
    }
    for override in req.overrides:
        key = override_key(override)
        if bad := unparsable(override) or unknown_option(override):
            problems.append(bad)
            continue
        if flag := RESERVED.get(key) or RESERVED.get(key.split(".")[0]):
            problems.append(f"override {override!r}: {key} is set by run.sh ({flag}); drop the override")
            continue
        if key in DEBUG_ONLY and not req.debug_mode:
            problems.append(
                f"override {override!r}: run.sh serves the policy itself; add --debug-mode to use an "
                "external server at that URL, or drop the override"
            )
            continue
        targets = [t for t, cfg in plain.items() if _has_key(cfg, key)]
        names = {"rollout": "rollout_train", "update": "update"}
        if override.startswith("+") and not targets and (closed := closed_parent(plain, key)):
            problems.append(closed)
            continue
        if not targets:  # a key a group choice adds (tracker.wandb.mode with tracker=wandb), whatever its value
            targets = [t for t in plain if chosen[t] and _has_key(_compose(names[t], [*base[t], *chosen[t]]), key)]
        if not targets and override.startswith("+") and "." in key:  # added under a node (+env.max_guesses)
            parent = key.rsplit(".", 1)[0]
            targets = [t for t, cfg in plain.items() if _has_key(cfg, parent)]
        if not targets:
            targets = [t for t in plain if _accepts(names[t], [*base[t], *chosen[t]], override)]
        if not targets:
            problems.append(
                f"override {override!r}: no key {key!r} in the rollout config (configs/rollout_*.yaml) "
                "or the update config (configs/update.yaml); check the spelling, or use +key=value "
                "to add a key"
            )
        for target in targets:
            getattr(routed, target).append(override)
    return routed, problems


def model_settings(req: Request) -> Any:
    """model_config as the overrides set it (a ModelConfig), composed on its own: run.sh finds the model
    before it composes the rest with it. ConfigError names every problem."""
    from rollout_engine import schema
    from rollout_engine.config import ModelConfig
    from rollout_engine.config import register_configs as register_rollout

    register_rollout()
    mine = [o for o in req.overrides if override_key(o).split(".")[0] == "model_config"]
    problems = [p for o in mine if (p := unparsable(o))]
    if problems:
        raise ConfigError(problems)
    try:
        cfg = _compose("rollout_train", [*_base(req)["rollout"], *mine])
    except Exception as exc:  # Hydra/OmegaConf composition errors are bad input here
        raise ConfigError([hydra_problem(exc)]) from None
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model_config)
    if problems := schema.problems(merged, "model_config"):
        raise ConfigError(problems)
    return OmegaConf.to_object(merged)


def route_and_compose(req: Request) -> Routed:
    """Route, then compose and validate each config once; raise one ConfigError listing every problem."""
    from rollout_engine.config import register_configs as register_rollout
    from rollout_engine.config import validate as validate_rollout
    from rollout_engine.tasks import rank_limits
    from training.config import register_configs as register_update
    from training.config import validate as validate_update

    register_rollout()
    register_update()
    routed, problems = route(req)
    if problems:
        raise ConfigError(problems)
    base = _base(req)
    found: dict[str, list[str]] = {}  # problem -> the configs that have it (rollout_train and rollout_test alike)
    runs = {}
    for name in ("rollout_train", "rollout_test", "update"):
        target = "update" if name == "update" else "rollout"
        try:
            cfg = _compose(name, [*base[target], *getattr(routed, target)])
            if target == "rollout":
                cfg = with_node_vllm(cfg, req.vllm)
                run = runs[name] = validate_rollout(cfg)
                routed.policy_base_url, routed.policy_model = run.policy_config.base_url, run.policy_config.model
                routed.max_sessions = max(routed.max_sessions, rank_limits(run)[0])
                routed.vllm = run.vllm_config
                routed.max_new_tokens = max(routed.max_new_tokens, run.policy_config.max_new_tokens)
            else:
                validate_update(OmegaConf.to_object(cfg))
            routed.resolved[name] = OmegaConf.to_container(cfg, resolve=True)
        except ConfigError as exc:
            for problem in exc.problems:
                found.setdefault(problem, []).append(name)
        except Exception as exc:  # Hydra/OmegaConf composition errors are bad input here
            found.setdefault(hydra_problem(exc), []).append(name)
    if not found:
        for split in req.rollout_splits:
            for problem in rollout_inputs(runs[f"rollout_{split}"]):
                found.setdefault(problem, []).append(f"rollout_{split}")
    problems = [f"{', '.join(names)}: {problem}" for problem, names in found.items()]
    if problems:
        raise ConfigError(problems)
    return routed


def with_node_vllm(cfg: DictConfig, vllm: dict[str, Any]) -> DictConfig:
    """`cfg` (a composed rollout config) with the node file's vllm_config values over its own (dicts replaced
    whole, not merged: the node file says all of limit_mm_per_prompt)."""
    if not vllm:
        return cfg
    with open_dict(cfg):
        for key, value in vllm.items():
            cfg.vllm_config[key] = value
    return cfg


def rollout_inputs(run: Any) -> list[str]:
    """The problems a rollout of `run` (a RolloutConfig) would find before it starts: its task file
    (load_tasks: missing, empty, not UTF-8, a bad line, a duplicate id), the environment's parameters
    (build_env) and the environment's word on each task (check_tasks)."""
    from rollout_engine.build import build_env
    from rollout_engine.runner import check_tasks
    from rollout_engine.tasks import load_tasks, tasks_path

    path = tasks_path(run)
    try:
        tasks = load_tasks(path, f"env_config.{run.split}_tasks")
        env = build_env(run)
    except ConfigError as exc:
        return exc.problems
    try:
        check_tasks(env, tasks, path)
    except ConfigError as exc:  # the refused tasks (five at most) and the fix: one error
        return ["; ".join(exc.problems)]
    return []
