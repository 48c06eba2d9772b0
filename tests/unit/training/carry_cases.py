"""Run in the train environment (torch, transformers): HF's Trainer with training.carry's callback on a tiny
model, the cases of tests/unit/training/test_carry.py.

    python tests/unit/training/carry_cases.py <folder> [zero2|zero3 PORT]    # prints `RESULT {...}`

With `zero2` or `zero3` the same cases run under DeepSpeed ZeRO-2 or ZeRO-3 (one rank on the CPU, gloo), whose
Adam state lives in flat partitions that the carry reads and fills through DeepSpeed's per-parameter accessors
(ZeRO-3 partitions the weights too: they are gathered to be compared).

Every example is the same (x, y), so the batches of a training do not depend on its sampler: 2 optimizer steps
then 3 more carried from them must end where 5 steps in one training end, with constant_with_warmup over 4
warmup steps (the 2nd training starts inside the warmup) and Adam. Without the carried state the 2nd training
starts its warmup and Adam's bias correction again.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

# torch and transformers are the train environment's: imported in the functions (the unit tests' app environment
# imports this file's package, and tests/unit/test_declared_deps.py checks module-level imports)
from training.carry import Plan, callback_class, read_state

LR, WARMUP = 0.1, 4


def model_and_data(steps: int):
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x, y):
            return {"loss": ((self.linear(x) - y) ** 2).mean()}

    example = {"x": torch.tensor([1.0, -2.0, 0.5]), "y": torch.tensor([0.3, -0.7])}
    return Tiny(), [example] * steps


def zero(stage: int) -> dict:
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
    }


def train(out: Path, steps: int, start, plan: Plan | None, name: str, deepspeed: dict | None = None) -> dict:
    """`steps` optimizer steps from the weights `start` (a state dict; None: the seed's), with the carry callback
    when `plan`; the weights and last learning rate after."""
    from transformers import Trainer, TrainingArguments

    model, data = model_and_data(steps)
    if start is not None:
        model.load_state_dict(start)
    args = TrainingArguments(
        output_dir=str(out / name),
        per_device_train_batch_size=1,
        learning_rate=LR,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=WARMUP,
        num_train_epochs=1,
        save_strategy="no",
        report_to=[],
        use_cpu=deepspeed is None,  # use_cpu turns DeepSpeed off (on a CPU-only machine it runs on the CPU anyway)
        logging_steps=1,
        disable_tqdm=True,
        weight_decay=0.0,
        deepspeed=deepspeed,
    )
    callbacks = [callback_class()(plan)] if plan else []
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    lrs = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    zero = type(trainer.optimizer.optimizer).__name__ if trainer.is_deepspeed_enabled else None
    if zero == "DeepSpeedZeroOptimizer_Stage3":  # each weight is a partition: gathered whole to be read
        from deepspeed.runtime.zero import GatheredParameters

        with GatheredParameters(list(model.parameters())):
            weights = {k: v.detach().clone() for k, v in model.named_parameters()}
    else:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"weights": weights, "lrs": lrs, "zero": zero}


def flat(weights) -> list[float]:
    return [x for v in weights.values() for x in v.flatten().tolist()]


def main(folder: Path, deepspeed: dict | None) -> dict:
    whole = train(folder, 5, None, None, "whole", deepspeed)
    first = train(folder, 2, None, Plan("", str(folder / "first" / "optimizer"), True), "first", deepspeed)
    carried = Plan(str(folder / "first" / "optimizer"), str(folder / "second" / "optimizer"), True)
    second = train(folder, 3, first["weights"], carried, "second", deepspeed)
    afresh = train(folder, 3, first["weights"], None, "afresh", deepspeed)
    schedule_only = Plan(str(folder / "first" / "optimizer"), str(folder / "third" / "optimizer"), False)
    third = train(folder, 3, first["weights"], schedule_only, "third", deepspeed)
    return {
        "whole": flat(whole["weights"]),
        "carried": flat(second["weights"]),
        "afresh": flat(afresh["weights"]),
        "lrs": {"whole": whole["lrs"], "first": first["lrs"], "second": second["lrs"], "third": third["lrs"]},
        "states": {name: asdict(read_state(folder / name / "optimizer")) for name in ("first", "second", "third")},
        "optimizer": second["zero"],
        "files": {name: sorted(p.name for p in (folder / name / "optimizer").iterdir()) for name in ("first", "third")},
    }


if __name__ == "__main__":
    stage = {"zero2": 2, "zero3": 3}.get(sys.argv[2]) if len(sys.argv) > 2 else None
    if stage:  # one rank of a process group, as torchrun would set it
        import os

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3] if len(sys.argv) > 3 else "29533")
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), zero(stage) if stage else None)))
