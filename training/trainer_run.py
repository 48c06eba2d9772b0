"""One rank's training of a recipe that carries Baton's own keys (training.recipe.BATON_KEYS).

    run(recipe_args, callbacks)                        # the warm trainer's workers (training.warm), every rank
    python -m training.trainer_run train_config.yaml   # under torchrun: the fresh path (training.launch)

LLaMA-Factory's training function (`llamafactory.train.tuner._training_function`, what `llamafactory-cli train`
runs on every rank), or for a grpo recipe training.pg_trainer's, with the callbacks those keys ask for (the
optimizer state carried across updates: training.carry); the keys are taken out before LLaMA-Factory's parser
reads the rest, which refuses keys it does not know.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from training.carry import CARRY, callbacks_for
from training.recipe import POLICY_GRADIENT


def run(args: dict[str, Any], callbacks: list[Any]) -> None:
    args = dict(args)
    callbacks = [*callbacks, *callbacks_for(args.pop(CARRY, None))]
    if POLICY_GRADIENT in args:
        from training import pg_trainer

        pg_trainer.run(args, callbacks)
    else:
        from llamafactory.train import tuner

        tuner._training_function({"args": args, "callbacks": callbacks})


def main(argv: list[str] | None = None) -> int:
    import yaml

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", stream=sys.stderr)
    run(yaml.safe_load(Path(argv[0]).read_text()), [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
