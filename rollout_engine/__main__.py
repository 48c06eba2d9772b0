"""Entry point: `python -m rollout_engine --config-name rollout_train|rollout_test key=value ...`.

validate -> save the resolved config under the log path -> build -> run ->
clean up (rollout_engine.runner). Exit codes (rollout_engine.exits,
docs/cli.md#exit-codes): 0 done, 2 bad input (config, task file, environment,
unreachable server; nothing written), 3 internal error, 75 the policy server
stopped answering (run.sh restarts vLLM and reruns with resume=true), 130 / 143
stopped by SIGINT / SIGTERM (rerun with resume=true).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from rollout_engine.config import register_configs, validate
from rollout_engine.errors import ConfigError, disk_full
from rollout_engine.exits import Exit
from rollout_engine.runner import run_rollout

logger = logging.getLogger("rollout_engine")


@hydra.main(config_path="../configs", config_name="rollout_train", version_base=None)
def rollout_main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        run_cfg = validate(cfg)
        code = asyncio.run(run_rollout(run_cfg, OmegaConf.to_yaml(cfg, resolve=True)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = Exit.BAD_INPUT
    except Exception as exc:
        if full := disk_full(exc):
            logger.error("rollout stopped: %s", full)
        else:
            logger.exception("rollout failed")
        code = Exit.INTERNAL
    raise SystemExit(code)


def main() -> None:
    """Hydra reports bad overrides and unknown keys with exit 1 before our code runs: that is bad input too."""
    from hydra.errors import HydraException

    register_configs()
    try:
        rollout_main()
    except SystemExit as exc:
        raise SystemExit(Exit.BAD_INPUT if exc.code == 1 else exc.code) from None
    except HydraException as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(Exit.BAD_INPUT) from None


if __name__ == "__main__":
    main()
