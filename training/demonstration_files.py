"""The one reader of demonstration files (`data.demonstrations`, docs/formats.md#demonstrations).

    trajectories = load_demonstrations(["/data/demos/textworld"])   # ConfigError naming file, line and fix
    problems = check_demonstrations(cfg.data.demonstrations)        # the same, as a list (training.config)

An entry is a folder written by `python -m rollout_engine.demonstrations`
(holding `demonstrations.jsonl`) or that file. A demonstration file is input:
a line that does not parse is an error, not a torn journal line. Imports no
other training module, so that the config's validation can use it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.inputs import input_lines
from rollout_engine.journal import trajectory_of
from rollout_engine.types import DEMONSTRATIONS_FILE, Trajectory

FIX = "write them again with python -m rollout_engine.demonstrations (docs/environments.md)"
FORM = "one trajectory per line, written by python -m rollout_engine.demonstrations; docs/formats.md"


def demonstration_file(path: str) -> Path:
    """The demonstrations.jsonl a `data.demonstrations` entry names (a folder holding one, or the file)."""
    given = Path(path)
    return given / DEMONSTRATIONS_FILE if given.is_dir() else given


def check_demonstrations(paths: list[str]) -> list[str]:
    """Every problem of the `data.demonstrations` entries: not absolute, missing, or a line that is no trajectory."""
    problems = []
    for path in paths:
        if not Path(path).is_absolute():
            problems.append(f"data.demonstrations must hold absolute paths (got {path!r}); pass /abs/path/to/{path}")
            continue
        try:
            load_demonstrations([path])
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def load_demonstrations(paths: list[str]) -> list[Trajectory]:
    """The trajectories of every entry, in order; relative image paths are made absolute against their file."""
    out: list[Trajectory] = []
    for path in paths:
        file = demonstration_file(path)
        try:
            data = file.read_bytes()
        except OSError as exc:
            what = f"cannot be read ({exc.strerror})"
            if not Path(path).exists():
                what = "does not exist"
            elif Path(path).is_dir():
                what = f"is a folder without {DEMONSTRATIONS_FILE}"
            raise ConfigError(
                f"data.demonstrations: {path!r} {what}; point it at a folder written by "
                f"python -m rollout_engine.demonstrations --out DIR, or at its {DEMONSTRATIONS_FILE}"
            ) from None
        lines = input_lines(data, f"data.demonstrations: {file}", FORM)
        if not lines:
            raise ConfigError(f"data.demonstrations: {file} holds no demonstrations; {FIX}, or drop the entry")
        seen: dict[str, int] = {}
        for number, text in lines:
            try:
                row = json.loads(text)
            except json.JSONDecodeError:
                raise ConfigError(
                    f"data.demonstrations: {file}:{number} is not JSON (got {text[:60]!r}); fix the line or {FIX}"
                ) from None
            trajectory = _trajectory(row, file, number)
            if trajectory.episode_id in seen:
                raise ConfigError(
                    f"data.demonstrations: {file}:{number} repeats episode {trajectory.episode_id!r} (first on line "
                    f"{seen[trajectory.episode_id]}); each episode once: remove the line or {FIX}"
                )
            seen[trajectory.episode_id] = number
            out.append(trajectory)
    return out


def _trajectory(row: Any, file: Path, number: int) -> Trajectory:
    trajectory = trajectory_of(row, f"data.demonstrations: {file}:{number}", f"fix the line or {FIX}")
    for turn in trajectory.turns:
        turn.images = [p if Path(p).is_absolute() else str(file.parent / p) for p in turn.images]
    return trajectory
