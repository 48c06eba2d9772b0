"""The valid values of every setting, declared once, beside the setting in its config dataclass.

    server_size: int = setting(8, Range(low=1))
    top_p: float = setting(1.0, Range(0, 1, low_open=True))
    max_steps: int = setting(-1, Range(low=1, special={-1: "no limit"}))
    live_view: str = setting("auto", Choice(LIVE_VIEWS))

A numeric setting gets a `Range` (bounds, open or closed, values allowed outside it with their meaning),
a setting with fixed choices a `Choice`. `problems(obj, prefix)` checks one config object (and, with
deep=True, the config objects inside it) and returns one message per bad value, naming the setting, the
value and what it must be; the configs' `validate` call it once (rollout_engine.config, training.config),
so run.sh's compose refuses a bad value before anything starts. `settings(cls)` lists what a config class
declares: tests/unit/test_config_schema.py generates the bad values of every setting from it (zero,
negative, absurd where the range excludes them; an unknown choice; a value of the wrong type), so a new
setting is covered without a new test, and every numeric setting must declare a range.

This module imports nothing heavy: the app environment composes and checks the update's config too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


def _num(x: float) -> str:
    """1.0 -> "1", 0.5 -> "0.5", 1e-06 -> "1e-06"."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


@dataclass(frozen=True)
class Range:
    """low <= value <= high (either bound may be open or absent); `special` values are allowed outside it."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    #: values allowed outside the range, with what each means: {-1: "all"}
    special: dict[float, str] = field(default_factory=dict)
    #: appended to the rule: "0 = every success"
    note: str = ""
    unit: str = ""

    def ok(self, value: float) -> bool:
        if value in self.special:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            rule = f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        elif self.low is not None:
            rule = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            rule = f"{'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            rule = "a number"
        if self.unit:
            rule += f" {self.unit}"
        if self.special:
            rule = " or ".join(f"{_num(v)} ({meaning})" for v, meaning in self.special.items()) + f" or {rule}"
        return rule + (f", {self.note}" if self.note else "")


@dataclass(frozen=True)
class Choice:
    """One of `options` (`note`, after the value, says what they mean)."""

    options: tuple[str, ...]
    note: str = ""

    def ok(self, value: str) -> bool:
        return value in self.options

    def describe(self) -> str:
        if len(self.options) == 2:
            return f"{self.options[0]} or {self.options[1]}"
        return f"one of {', '.join(self.options)}"


Rule = Range | Choice


def setting(default: Any, rule: Rule) -> Any:
    """A dataclass field with `default` and the rule its values must follow."""
    return field(default=default, metadata={"rule": rule})


def rule_of(f: dataclasses.Field) -> Rule | None:
    return f.metadata.get("rule")


def message(path: str, rule: Rule, value: Any) -> str:
    shown = repr(value) if isinstance(value, str) else value
    after = f"; {rule.note}" if isinstance(rule, Choice) and rule.note else ""
    return f"{path} must be {rule.describe()} (got {shown}){after}"


def _class_of(obj: Any) -> type | None:
    """The config class of a config object: a dataclass instance's, or a structured DictConfig's."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj)
    from omegaconf import DictConfig, OmegaConf

    if isinstance(obj, DictConfig):
        cls = OmegaConf.get_type(obj)
        return cls if dataclasses.is_dataclass(cls) else None
    return None


def _value(obj: Any, name: str) -> Any:
    """obj.name, or None where a DictConfig leaves it missing (??? : another check names it)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(obj, DictConfig) and (name not in obj or OmegaConf.is_missing(obj, name)):
        return None
    return getattr(obj, name)


def problems(obj: Any, prefix: str = "", deep: bool = True) -> list[str]:
    """One message per setting of config object `obj` (a config dataclass's instance, or a structured
    DictConfig of one: checked before its __post_init__ runs) whose value breaks its rule; with `deep`,
    also of the config objects in its fields (and in dict fields: `difficulty_ratio.<name>`). `prefix`
    names `obj` (env_config)."""
    cls = _class_of(obj)
    if cls is None:
        return []
    found: list[str] = []
    for f in dataclasses.fields(cls):
        value = _value(obj, f.name)
        path = f"{prefix}.{f.name}" if prefix else f.name
        rule = rule_of(f)
        if rule is not None and value is not None and not isinstance(value, bool) and not rule.ok(value):
            found.append(message(path, rule, value))
        if not deep or value is None:
            continue
        if _class_of(value) is not None:
            found += problems(value, path)
        elif isinstance(value, Mapping):
            found += [p for key, item in value.items() for p in problems(item, f"{path}.{key}")]
    return found


@dataclass(frozen=True)
class Setting:
    """One leaf setting of a config class: its dotted path, its type (Optional unwrapped) and its rule."""

    path: str
    type: Any
    rule: Rule | None
    optional: bool


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def settings(cls: type, prefix: str = "") -> Iterator[Setting]:
    """Every leaf setting of config class `cls`, recursing into fields whose type is a config class, and into
    a dict of them (its key written `<name>`: env_config.difficulty_ratio.<name>.low). A field typed Any,
    another dict or a list is a leaf (algorithm.selection's class depends on the algorithm chosen)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        hint, optional = _unwrap(hints[f.name])
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            yield from settings(hint, path)
        elif typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            yield from settings(args[1], f"{path}.<name>")
        else:
            yield Setting(path, hint, rule_of(f), optional)
