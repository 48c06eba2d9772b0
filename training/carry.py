"""The optimizer and the learning-rate schedule carried from one update to the next (algorithm.carry_optimizer).

An update trains from a policy version; at the end of its training it writes its optimizer's state beside it
(training/iter_<NNNN>/optimizer/), promotion keeps that with the version it makes (policy/v<NNNN>/optimizer/),
and the next update starts from the state of the version it trains from: in the warm trainer or fresh
processes alike, and an update redone after --resume starts from the same files, so it continues exactly.

    optimizer/state.json           {"format", "optimizer_steps", "lr_scheduler_type", "moments", "parameters"}
    optimizer/moments.safetensors  "<parameter>::<key>": each trained parameter's fp32 optimizer tensors (Adam's
                                   exp_avg, exp_avg_sq), by the parameter's name; with "moments" only

Safetensors and JSON only: nothing here is a pickle (the log path is shared).

What carries:
- The schedule. `optimizer_steps` counts the run's optimizer steps before the update; a schedule that is a
  function of the step alone (SHIFTED: constant_with_warmup, the default, warms up once per run) continues
  from there. One with a horizon (linear, cosine, ...) is HF's over the update's own steps, so it restarts.
- Adam's moments and step count, per parameter by name, for a full or freeze fine-tune (`moments`): without
  DeepSpeed through the optimizer's own state dict; under DeepSpeed ZeRO-1/2/3 through DeepSpeed's own per-
  parameter accessors (`safe_get_full_optimizer_state` / `safe_set_full_optimizer_state`), which gather and
  scatter each parameter's fp32 state across its partitions, so the file does not depend on the number of
  ranks. ZeRO keeps Adam's state in flat per-rank partitions that torch's Adam fills at the first step;
  `zero_restore` creates them before, as that step would. Not for a LoRA: every update trains a new adapter,
  merged into the weights at promotion.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout_engine.files import fsync_dir, save_json

log = logging.getLogger(__name__)

#: the recipe's key for the carry plan; taken out before LLaMA-Factory's parser reads the rest
CARRY = "baton_carry"
#: the folder, in an update's output and in a policy version
OPTIMIZER_FOLDER = "optimizer"
STATE, MOMENTS = "state.json", "moments.safetensors"
FORMAT = 1
#: HF schedules that are a function of the step alone: these continue at the run's step count
SHIFTED = ("constant", "constant_with_warmup", "inverse_sqrt")


@dataclass(frozen=True)
class Plan:
    """Where an update's training reads the carried state (`load`: a folder, "" = none: the base model, or a
    version without one) and writes its own (`save`), and whether Adam's moments carry (`moments`)."""

    load: str
    save: str
    moments: bool

    @classmethod
    def of(cls, recipe_value: dict[str, Any] | None) -> Plan | None:
        return None if recipe_value is None else cls(**recipe_value)


@dataclass(frozen=True)
class State:
    """`state.json`."""

    optimizer_steps: int
    lr_scheduler_type: str
    moments: bool
    parameters: int = 0
    format: int = FORMAT


def read_state(folder: Path) -> State | None:
    """The carried state in `folder` (None when there is none). A state of another format is an error."""
    path = folder / STATE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} has format {data.get('format')}; this Baton reads format {FORMAT}")
    return State(**data)


def plan_for(model: Path, save: Path, finetuning_type: str) -> dict[str, Any]:
    """The recipe's `baton_carry` for an update that trains from the version folder `model` (its `optimizer/`,
    when it has one) and writes to `save`."""
    load = model / OPTIMIZER_FOLDER
    moments = finetuning_type in ("full", "freeze")
    return asdict(Plan(str(load) if (load / STATE).is_file() else "", str(save), moments))


def write_state(folder: Path, state: State, tensors: dict[str, Any]) -> None:
    """`state.json` and (with moments) `moments.safetensors` into `folder`, replacing it whole: written into a
    staging folder beside it, renamed into place."""
    from safetensors.torch import save_file

    staging = folder.with_name(f".{folder.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if tensors:
        save_file(tensors, str(staging / MOMENTS), metadata={"format": "pt"})
        with open(staging / MOMENTS, "rb") as f:
            os.fsync(f.fileno())
    save_json(staging / STATE, asdict(state))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(staging, folder)
    fsync_dir(folder.parent)


def inner(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's (and DeepSpeed's) wrappers."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def gather(model: Any, optimizer: Any) -> dict[str, Any]:
    """Each trained parameter's optimizer tensors by name (`<name>::<key>`, fp32 on the CPU); the step count
    saved is the callback's (the run's steps before the update plus this training's)."""
    torch_optimizer = inner(optimizer)
    tensors: dict[str, Any] = {}
    for name, param in model.named_parameters():
        state = torch_optimizer.state.get(param) or {}
        for key, value in state.items():
            if key != "step" and hasattr(value, "shape") and tuple(value.shape) == tuple(param.shape):
                tensors[f"{name}::{key}"] = value.detach().float().cpu().contiguous()
    return tensors


def restore(model: Any, optimizer: Any, folder: Path, step: int) -> int:
    """Put the moments in `folder` into `optimizer` for the parameters of `model` they name (a parameter the
    file lacks starts afresh); returns how many parameters got theirs. Through the optimizer's own
    load_state_dict, which casts and places them as it would its own saved state."""
    import torch
    from safetensors import safe_open

    torch_optimizer = inner(optimizer)
    index = {id(p): i for i, p in enumerate(p for group in torch_optimizer.param_groups for p in group["params"])}
    saved = torch_optimizer.state_dict()
    restored: dict[int, dict[str, Any]] = {}
    with safe_open(str(folder / MOMENTS), "pt") as f:
        keys = set(f.keys())
        for name, param in model.named_parameters():
            own = [k for k in keys if k.startswith(f"{name}::")]
            if id(param) not in index or not own:
                continue
            entry: dict[str, Any] = {"step": torch.tensor(float(step))}
            for key in own:
                tensor = f.get_tensor(key)
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{folder / MOMENTS}: {key} has shape {tuple(tensor.shape)}, the model's {name} "
                        f"{tuple(param.shape)}; set algorithm.carry_optimizer=false"
                    )
                entry[key.split("::", 1)[1]] = tensor
            restored[index[id(param)]] = entry
    saved["state"] = restored
    torch_optimizer.load_state_dict(saved)
    return len(restored)


def zero_optimizer(optimizer: Any) -> Any | None:
    """DeepSpeed's ZeRO optimizer inside accelerate's wrapper, stage 1/2's or stage 3's (None: another one)."""
    while optimizer is not None and not hasattr(optimizer, "single_partition_of_fp32_groups"):
        if hasattr(optimizer, "fp32_partitioned_groups_flat"):  # stage 3
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return optimizer


def zero_partitions(zero: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Each flat fp32 partition of this rank that torch's Adam keeps state for, with its parameter group.
    Stage 1/2: one per group. Stage 3: one per sub-group, which it hands to the optimizer as that group's
    parameters only while it steps it (`sub_group_to_group_id`)."""
    base = zero.optimizer
    if hasattr(zero, "single_partition_of_fp32_groups"):
        return list(zip(zero.single_partition_of_fp32_groups, base.param_groups, strict=True))
    flats = zero.fp32_partitioned_groups_flat
    return [(flat, base.param_groups[zero.sub_group_to_group_id[i]]) for i, flat in enumerate(flats)]


def zero_gather(model: Any, zero: Any, keep: bool) -> dict[str, Any]:
    """`gather` under ZeRO: each parameter's full fp32 state, assembled from every rank's partition (a
    collective: every rank calls it, in the same order; only the one that writes `keep`s what it got)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    relink(zero)
    base = zero.optimizer
    flat = zero_partitions(zero)[0][0]
    keys = [k for k, v in base.state.get(flat, {}).items() if hasattr(v, "shape") and v.shape == flat.shape]
    tensors: dict[str, Any] = {}
    for name, param in model.named_parameters():
        shape = getattr(param, "ds_shape", param.shape)  # stage 3: the parameter's own shape, not its partition's
        for key in keys:
            value = safe_get_full_optimizer_state(param, key) if param.requires_grad else None
            if value is not None and keep:
                tensors[f"{name}::{key}"] = value.detach().float().cpu().contiguous().view(shape)
    return tensors


def relink(zero: Any) -> None:
    """Point every parameter's view of its optimizer state at its group's current state. ZeRO-1/2 links them
    once, right after the first group's first step (0.19.8, `_lazy_init_hp_params_optimizer_state`), when
    the other groups (HF's parameters without weight decay) have no state yet: theirs stay unlinked. Stage 3
    looks each parameter's state up when asked: nothing to link."""
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def zero_restore(model: Any, zero: Any, folder: Path, step: int) -> int:
    """`restore` under ZeRO: Adam's state of each flat partition created as its first step would (zeros,
    the step count carried), linked to the parameters, then each parameter's saved moments scattered into
    the partitions that hold it."""
    import torch
    from deepspeed.utils import safe_set_full_optimizer_state
    from safetensors import safe_open

    base = zero.optimizer
    for flat, group in zero_partitions(zero):
        on_device = group.get("fused") or group.get("capturable")
        count = torch.tensor(float(step), dtype=torch.float32, device=flat.device if on_device else "cpu")
        zeros = {key: torch.zeros_like(flat, memory_format=torch.preserve_format) for key in ("exp_avg", "exp_avg_sq")}
        base.state[flat] = {"step": count, **zeros}
    relink(zero)
    restored = 0
    with safe_open(str(folder / MOMENTS), "pt") as f:
        keys = set(f.keys())
        for name, param in model.named_parameters():
            own = [k for k in keys if k.startswith(f"{name}::")]
            for key in own:
                safe_set_full_optimizer_state(param, f.get_tensor(key).to(param.device), key.split("::", 1)[1])
            restored += bool(own)
    return restored


def shift_schedule(scheduler: Any, steps: int) -> bool:
    """Make HF's LambdaLR `scheduler` continue at step `steps` (its lambdas read step + steps) and set the
    learning rate of the first step; False when it is not a LambdaLR."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None or steps == 0:
        return lambdas is not None
    scheduler.lr_lambdas = [functools.partial(_shifted, f, steps) for f in lambdas]
    groups = scheduler.optimizer.param_groups
    for group, base, f in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * f(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]
    return True


def _shifted(f: Any, steps: int, step: int) -> float:
    return f(step + steps)


@functools.cache
def callback_class() -> type:
    """`CarryCallback`, a transformers TrainerCallback (defined on first use: the app environment imports every
    module of training/, and transformers is the train environment's)."""
    from transformers import TrainerCallback

    class CarryCallback(TrainerCallback):
        """Load the carried state when the training begins (the optimizer and schedule exist), save it when
        it ends."""

        def __init__(self, plan: Plan) -> None:
            self.plan = plan
            self.before = 0

        def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            kind = getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type))
            carried = read_state(Path(self.plan.load)) if self.plan.load else None
            if carried is None:
                log.info("carry: no optimizer state to start from (%s): a fresh optimizer", self.plan.load or "-")
                return
            self.before = carried.optimizer_steps
            said = [f"{carried.optimizer_steps} optimizer steps before this update"]
            if kind in SHIFTED and shift_schedule(lr_scheduler, carried.optimizer_steps):
                said.append(f"{kind} continues at step {carried.optimizer_steps}")
            else:
                said.append(f"{kind} has a horizon of this update's steps: it starts over")
            zero = zero_optimizer(optimizer) if args.deepspeed else None
            if self.plan.moments and carried.moments and (zero is not None or not args.deepspeed):
                load = zero_restore if zero is not None else restore
                count = load(model, zero or optimizer, Path(self.plan.load), carried.optimizer_steps)
                said.append(f"Adam's moments of {count} parameters")
            else:
                said.append("Adam's moments start afresh (" + why_fresh(self.plan, carried.moments, args) + ")")
            log.info("carry from %s: %s", self.plan.load, "; ".join(said))

        def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            zero = zero_optimizer(optimizer) if args.deepspeed else None
            moments = self.plan.moments and (zero is not None or not args.deepspeed)
            if zero is not None and moments:  # a collective: every rank gathers, rank 0 writes
                tensors = zero_gather(model, zero, keep=state.is_world_process_zero)
            elif moments and state.is_world_process_zero:  # without DeepSpeed every rank holds the same state
                tensors = gather(model, optimizer)
            else:
                tensors = {}
            if not state.is_world_process_zero:
                return
            kind = getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type))
            steps = self.before + int(state.global_step)
            named = len({key.split("::")[0] for key in tensors})
            write_state(Path(self.plan.save), State(steps, kind, moments, named), tensors)
            log.info("carry: saved %d optimizer steps%s to %s", steps, " and Adam's moments" * moments, self.plan.save)

    return CarryCallback


def why_fresh(plan: Plan, saved_moments: bool, args: Any) -> str:
    """Why an update that carries the schedule starts Adam's moments afresh."""
    if not plan.moments:
        return "a LoRA trains a new adapter each update"
    if not saved_moments:
        return "the version's state has none"
    return "DeepSpeed runs an optimizer other than its ZeRO ones here, whose state Baton does not read"


def callbacks_for(value: dict[str, Any] | None) -> list[Any]:
    """The callbacks a recipe's `baton_carry` value asks for (none without one)."""
    plan = Plan.of(value)
    return [] if plan is None else [callback_class()(plan)]
