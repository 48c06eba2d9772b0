"""Entry point of the update phase (run in the train environment).

    python -m training --config-name update log_path=L iteration=N [model_path=M] [algorithm=rft|kto|dpo] ...
    python -m training --config-name update phase=check log_path=L iteration=N model_path=M ...

Exit codes (rollout_engine.exits, docs/cli.md#exit-codes): 0 done, 2 bad input
(nothing written, nothing launched; or a setting the trainer refused while it
trained, which no retry mends: training.update.refusal), 1 the training failed
(policy/current unchanged; run again to retry), 3 too little data to fill one optimizer step
(nothing written), 130 / 143 stopped by SIGINT / SIGTERM (the LLaMA-Factory
group is stopped first).

`phase=check` validates the config, asks LLaMA-Factory about it (template,
argument parser, tokenizer, DeepSpeed preset) and stops: exit 0 accepted, 2
rejected. It writes nothing and launches nothing; run.sh runs it before the
first rollout.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rollout_engine.errors import ConfigError, disk_full
from rollout_engine.exits import Exit

log = logging.getLogger("training")
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


def main() -> None:
    import hydra

    from training.config import register_configs
    from training.launch import exit_on_signals

    exit_on_signals()
    register_configs()
    entered: list[bool] = []

    def task(dict_cfg) -> None:
        entered.append(True)
        sys.exit(run(dict_cfg))

    try:
        hydra.main(config_path=CONFIG_DIR, config_name="update", version_base="1.3")(task)()
    except SystemExit as exc:
        if exc.code not in (0, None) and not entered:  # Hydra rejected the config (it printed why)
            raise SystemExit(Exit.BAD_INPUT) from exc
        raise


def run(dict_cfg) -> int:
    """validate -> log config -> run, with this node's GPUs hidden from this process (the trainer's processes
    use them; validate imports LLaMA-Factory, which initialises CUDA where it sees a GPU); returns the exit code."""
    from training.launch import hidden_gpus

    with hidden_gpus() as device:
        return _run(dict_cfg, device)


def _run(dict_cfg, device) -> int:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from training.config import UpdateConfig, validate
    from training.update import NothingToTrain, TrainingError, describe_config, run_update

    try:
        cfg: UpdateConfig = OmegaConf.to_object(dict_cfg)
        validate(cfg)
    except (ConfigError, OmegaConfBaseException) as exc:
        log.error("bad config:\n%s", exc)
        return Exit.BAD_INPUT
    log.info(describe_config(cfg))
    try:
        run_update(cfg, device)
    except NothingToTrain as exc:
        log.error("nothing to train on:\n%s", exc)
        return Exit.NOTHING_TO_TRAIN
    except ConfigError as exc:
        log.error("bad input:\n%s", exc)
        return Exit.BAD_INPUT
    except TrainingError as exc:
        log.error("%s", exc)
        return Exit.FAILED
    except OSError as exc:
        if full := disk_full(exc):
            log.error("update stopped: %s. policy/current is unchanged", full)
            return Exit.FAILED
        raise
    return Exit.OK


if __name__ == "__main__":
    main()
