"""Every setting of the rollout and update configs declares its valid values once, beside the setting
(rollout_engine.schema: a numeric setting's `Range`, an enum's `Choice`), and run.sh's compose refuses a value
outside them by name before anything starts (issue 26).

The bad values are generated from the schema, so a new setting is covered without a new test: for every numeric
setting zero, a negative and an absurd value wherever its range refuses them; for every enum an unknown choice;
for every setting a value of the wrong type. Each goes through what run.sh runs, in-process:
`coordinator.overrides.route_and_compose` for the out-of-range values and unknown choices (batched: compose
reports every problem at once; each must name its setting, the value and the rule), `route` plus the same Hydra
composition for the wrong types (Hydra stops at the first one of a config, so one composition each).

    pytest tests/unit/test_config_schema.py -q
"""

from __future__ import annotations

import copy
import json
import subprocess
import typing
from collections import defaultdict
from dataclasses import dataclass

import pytest
from omegaconf import DictConfig

from coordinator.overrides import RESERVED, Request, _base, _compose, hydra_problem, route, route_and_compose
from rollout_engine.config import RolloutConfig
from rollout_engine.config import register_configs as register_rollout
from rollout_engine.errors import ConfigError
from rollout_engine.schema import Choice, Range, Setting, settings
from training.config import (
    DPOSelectionConfig,
    GroupSelectionConfig,
    KTOSelectionConfig,
    RFTSelectionConfig,
    UpdateConfig,
)
from training.config import register_configs as register_update

#: (config class, its path, the group choices that bring it in, the config run.sh composes it into)
ROOTS = [
    (RolloutConfig, "", (), "rollout"),
    (UpdateConfig, "", (), "update"),
    (RFTSelectionConfig, "algorithm.selection", (), "update"),
    (KTOSelectionConfig, "algorithm.selection", ("algorithm=kto",), "update"),
    (DPOSelectionConfig, "algorithm.selection", ("algorithm=dpo",), "update"),
    (GroupSelectionConfig, "algorithm.selection", ("algorithm=grpo",), "update"),
]
#: settings under a path that a group choice brings in
CHOICES_FOR = {"tracker.wandb.": ("tracker=wandb",), "algorithm.policy_gradient.": ("algorithm=grpo",)}
UNKNOWN = "no_such_choice"
MODEL_CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}


@dataclass(frozen=True)
class Case:
    setting: str  # its path in the schema (a dict's key as <name>)
    form: str  # zero | negative | absurd | unknown choice | wrong type
    value: str  # as written on the command line
    shown: str  # as the error shows it
    context: tuple[str, ...]  # the group choices it needs
    config: str  # rollout | update

    @property
    def override(self) -> str:
        """`key=value`; a setting inside a dict of configs gets one entry: `+a.b={x:{low:0}}`."""
        if "<name>" in self.setting:
            head, leaf = self.setting.split(".<name>.")
            return f"+{head}={{x:{{{leaf}:{self.value}}}}}"
        return f"{self.setting}={self.value}"

    @property
    def names(self) -> list[str]:
        """What the error must name: the setting (its dict's path and its leaf for one in a dict)."""
        return self.setting.split(".<name>.") if "<name>" in self.setting else [self.setting]

    @property
    def id(self) -> str:
        return f"{self.setting}-{self.form.replace(' ', '_')}"


def reserved(path: str) -> bool:
    return path in RESERVED or path.split(".")[0] in RESERVED


def leaves() -> list[tuple[Setting, tuple[str, ...], str]]:
    """Every setting a user may override, with the group choices it needs and its config."""
    found = []
    for cls, prefix, context, config in ROOTS:
        for s in settings(cls, prefix):
            if reserved(s.path) or s.path.endswith("._target_") or s.path == "_target_" or s.type is typing.Any:
                continue
            if typing.get_origin(s.type) in (dict, list) or s.type in (dict, list):
                continue
            needs = next((c for p, c in CHOICES_FOR.items() if s.path.startswith(p)), ())
            found.append((s, (*context, *needs), config))
    return found


def shown(value: float, integer: bool) -> str:
    return str(int(value)) if integer else repr(float(value))


def out_of_range(rule: Range, integer: bool) -> dict[str, float]:
    """Zero, a negative and an absurd value (ten times the upper bound), those the range refuses."""
    found: dict[str, float] = {}
    if not rule.ok(0):
        found["zero"] = 0
    negative = next((v for v in ((-1, -2) if integer else (-0.5, -2.0)) if not rule.ok(v)), None)
    if negative is not None:
        found["negative"] = negative
    if rule.high is not None and not rule.ok(rule.high * 10 + 1):
        found["absurd"] = rule.high * 10 + 1
    return found


def refused_cases() -> list[Case]:
    """The out-of-range values and unknown choices of every setting."""
    cases = []
    for s, context, config in leaves():
        if isinstance(s.rule, Range):
            integer = s.type is int
            for form, value in out_of_range(s.rule, integer).items():
                text = shown(value, integer)
                cases.append(Case(s.path, form, text, f"(got {text})", context, config))
        elif isinstance(s.rule, Choice):
            cases.append(Case(s.path, "unknown choice", UNKNOWN, f"(got {UNKNOWN!r})", context, config))
    return cases


def wrong_type_cases() -> list[Case]:
    """A word for a number or a bool, a list for a string of fixed choices."""
    cases = []
    for s, context, config in leaves():
        if s.type in (int, float):
            cases.append(Case(s.path, "wrong type", "abc", "'abc'", context, config))
        elif s.type is bool:
            cases.append(Case(s.path, "wrong type", "maybe", "'maybe'", context, config))
        elif isinstance(s.rule, Choice):
            cases.append(Case(s.path, "wrong type", "[a,b]", "list", context, config))
    return cases


REFUSED = refused_cases()
WRONG_TYPES = wrong_type_cases()
#: the refused values batched by (group choices, form): one compose each (a dict's entry is set whole: alone)
BATCHES: dict[str, list[Case]] = defaultdict(list)
for _case in REFUSED:
    _alone = _case.setting if "<name>" in _case.setting else ""
    BATCHES[" ".join([*_case.context, _alone]).strip() + ":" + _case.form].append(_case)


@pytest.fixture(scope="module")
def request_for(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("schema")
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    register_rollout()
    register_update()

    def make(overrides: list[str]) -> Request:
        return Request(str(tmp / "data"), str(tmp / "log"), str(tmp / "model"), overrides)

    return make


def test_every_numeric_setting_has_a_range_and_every_enum_its_choices() -> None:
    """A new int or float setting without a Range fails here; the enums are the Choice settings."""
    missing = [s.path for s, _, _ in leaves() if s.type in (int, float) and not isinstance(s.rule, Range)]
    assert not missing, f"numeric settings without a Range (rollout_engine.schema): {missing}"
    enums = {s.path for s, _, _ in leaves() if isinstance(s.rule, Choice)}
    for known in ("env_config.live_view", "algorithm.stage", "launch.deepspeed", "tracker.wandb.mode"):
        assert known in enums
    assert len(REFUSED) >= 80 and len(WRONG_TYPES) >= 80


@pytest.mark.parametrize("batch", sorted(BATCHES), ids=sorted(BATCHES))
def test_compose_refuses_every_out_of_range_value_and_unknown_choice(batch: str, request_for) -> None:
    cases = BATCHES[batch]
    context = list(cases[0].context)
    with pytest.raises(ConfigError) as caught:
        route_and_compose(request_for([*context, *(c.override for c in cases)]))
    problems = caught.value.problems
    for case in cases:
        named = [p for p in problems if all(n in p for n in case.names) and case.shown in p]
        assert named, (case.override, problems)
        assert "must be" in named[0], named[0]


def test_compose_routes_every_wrong_type_to_the_config_that_has_it(request_for) -> None:
    """route() (run.sh's routing, before composing) sends each wrong-typed value to its setting's config."""
    by_context: dict[tuple[str, ...], list[Case]] = defaultdict(list)
    for case in WRONG_TYPES:
        by_context[case.context].append(case)
    for context, cases in by_context.items():
        routed, problems = route(request_for([*context, *(c.override for c in cases)]))
        assert not problems, problems
        for case in cases:
            assert case.override in getattr(routed, case.config), (case.override, routed)


@pytest.fixture(scope="module")
def composed(request_for):
    """The setting's config as compose composes it with its group choices (one composition per config and
    choices), and Hydra's parser of overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cache: dict[tuple[str, tuple[str, ...]], DictConfig] = {}
    parser = OverridesParser.create()

    def get(case: Case) -> tuple[DictConfig, list]:
        key = (case.config, case.context)
        if key not in cache:
            name = "rollout_train" if case.config == "rollout" else "update"
            cache[key] = _compose(name, [*_base(request_for([]))[case.config], *case.context])
        return copy.deepcopy(cache[key]), parser.parse_overrides([case.override])

    return get


@pytest.mark.parametrize("case", WRONG_TYPES, ids=[c.id for c in WRONG_TYPES])
def test_compose_refuses_a_wrong_type(case: Case, composed) -> None:
    """The override applied as Hydra's compose applies it (to the composed config: one composition per config
    instead of one per case), its error worded as compose words it."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    cfg, overrides = composed(case)
    with pytest.raises(Exception) as caught:  # Hydra's composition error, which compose reports
        ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)
    problem = hydra_problem(caught.value)
    assert all(n in problem for n in case.names) and case.value in problem, problem
    assert "give that key a value of its type" in problem


def test_one_wrong_type_through_compose_is_one_error(request_for) -> None:
    with pytest.raises(ConfigError) as caught:
        route_and_compose(request_for(["tracker=wandb", "tracker.wandb.mode=[1]"]))
    assert len(caught.value.problems) == 1
    assert "tracker.wandb.mode=[1]" in caught.value.problems[0] and "update:" in caught.value.problems[0]


def test_the_choices_passed_to_llama_factory_are_ones_the_pinned_packages_take() -> None:
    """The update's enums handed to LLaMA-Factory as they are: every choice is one the train environment's
    LLaMA-Factory and transformers accept (an upgrade that drops one fails here, not in a user's update)."""
    from tests.conftest import env_python
    from training.config import FINETUNING_TYPES, LR_SCHEDULERS, PREF_LOSSES, STAGES

    script = (
        "import json, typing\n"
        "from transformers import SchedulerType\n"
        "from llamafactory.hparams import FinetuningArguments\n"
        "hints = typing.get_type_hints(FinetuningArguments)\n"
        "taken = {k: list(typing.get_args(hints[k])) for k in ('stage', 'finetuning_type', 'pref_loss')}\n"
        "taken['lr_scheduler_type'] = [s.value for s in SchedulerType]\n"
        "print(json.dumps(taken))\n"
    )
    out = subprocess.run([env_python("train"), "-c", script], capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    taken = json.loads(out.stdout.splitlines()[-1])
    ours = {"stage": STAGES, "finetuning_type": FINETUNING_TYPES, "pref_loss": PREF_LOSSES}
    ours["lr_scheduler_type"] = LR_SCHEDULERS
    for name, choices in ours.items():
        assert taken[name], f"{name}: found no choices in the pinned packages"
        assert set(choices) <= set(taken[name]), f"{name}: {sorted(set(choices) - set(taken[name]))} not accepted"
