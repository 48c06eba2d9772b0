"""Run in the train environment: `python -m training ... phase=check` on a few configs in one process, print JSON.

python tests/unit/training/check_with_llamafactory.py <model_dir> <log_path> [name=override,... ...]

Each case composes configs/update.yaml with its overrides and runs the entry point's `run`, as
`python -m training` does after Hydra; it prints `RESULT {"<name>": {"exit": N, "log": "..."}}`.
"""

from __future__ import annotations

import io
import json
import logging
import sys

from hydra import compose, initialize_config_dir

from training.__main__ import CONFIG_DIR, run
from training.config import register_configs


def check(model: str, log_path: str, overrides: list[str]) -> dict:
    """One case: the exit code of phase=check and what it logged."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("update", overrides=[f"log_path={log_path}", "iteration=1", f"model_path={model}", *overrides])
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger("training").addHandler(handler)
    try:
        code = run(cfg)
    finally:
        logging.getLogger("training").removeHandler(handler)
    return {"exit": code, "log": out.getvalue()}


def main(model: str, log_path: str, cases: list[str]) -> None:
    register_configs()
    logging.getLogger("training").setLevel(logging.INFO)
    result = {}
    for case in cases:
        name, _, overrides = case.partition("=")
        result[name] = check(model, log_path, ["phase=check", *filter(None, overrides.split(","))])
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
