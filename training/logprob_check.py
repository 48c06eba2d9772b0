"""Log-probability fidelity: the trainer's log-probabilities of the sampled tokens against vLLM's.

    gap = check_logprobs(Path("training/iter_0003/data"), model_dir, samples=32, dtype="bfloat16")  # train env
    python -m training.logprob_check <dataset dir> <model dir> [--dtype float32|bfloat16] [--samples N]
    data.logprob_samples=N                # the update runs it after token fidelity, before training

A policy-gradient update forms the importance ratio exp(trainer - sampler) per sampled token against the
log-probabilities vLLM recorded at rollout (`completion_logprobs` in `<split>.token_ids.jsonl`). Before any
optimizer step the two models are the same weights, so the ratio is 1 up to numerics; a gap beyond numerics
means the trainer is not scoring what was sampled (another model version, another chat template, a
temperature applied on one side), and clipping then silently drops the gradient. This recomputes, with Hugging
Face transformers, the log-probability of every recorded reply token given the prompt ids and the reply ids
before it, fed as the trainer sees them (token fidelity, training.fidelity, checks that LLaMA-Factory's ids
are exactly these), and reports the gap: mean and largest |trainer - vLLM| per token, and the ratio's mean,
min, max and the share of tokens outside [0.8, 1.2] (PPO's usual clip range).

vLLM reports the model's own distribution (its default `logprobs_mode`, raw_logprobs: log_softmax of the
logits before temperature, top-p or top-k), so the trainer's side is a plain log_softmax of its logits.
A mean gap above `WARN_MEAN_GAP` is logged; above `REFUSE_MEAN_GAP` it is a ConfigError (exit 2). The
thresholds come from measurement on the default model (docs/update.md, "Log-probability fidelity").
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.types import logprobs_problem
from training.dataset import load_token_ids, sampled_turns

log = logging.getLogger(__name__)

#: the ratio band counted in `LogprobGap.outside` (PPO's clip range at epsilon 0.2)
BAND = (0.8, 1.2)
#: mean |trainer - vLLM| per token (nats) above which the check warns, and refuses. Measured on the default
#: model (docs/update.md): numerics alone gave 6e-6 (both float32) to 0.042 (both bfloat16); a trainer dividing
#: its logits by a sampling temperature of 0.9 that vLLM did not apply gave 0.146 (24% of ratios outside BAND)
WARN_MEAN_GAP = 0.06
REFUSE_MEAN_GAP = 0.1
DTYPES = ("float32", "bfloat16")


@dataclass
class LogprobGap:
    """Per-token gap between the trainer's and vLLM's log-probabilities of the sampled tokens."""

    #: replies compared (a DPO row has two), tokens compared in them
    replies: int
    tokens: int
    #: rows with no recorded log-probabilities (a demonstration, or an old journal's step)
    without_logprobs: int
    mean_abs_gap: float
    max_abs_gap: float
    #: exp(trainer - vLLM) over the tokens
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    #: share of tokens whose ratio lies outside BAND
    outside: float
    #: where max_abs_gap is: "<source> token <i>"
    worst: str = ""

    def describe(self) -> str:
        return (
            f"{self.tokens} tokens of {self.replies} replies: mean |gap| {self.mean_abs_gap:.4f}, "
            f"max {self.max_abs_gap:.4f} ({self.worst}); ratio mean {self.ratio_mean:.4f}, "
            f"min {self.ratio_min:.4f}, max {self.ratio_max:.4f}, "
            f"{100 * self.outside:.2f}% outside [{BAND[0]}, {BAND[1]}]"
        )


@dataclass
class Reply:
    """One sampled reply of a dataset row: its ids and what vLLM recorded for them."""

    source: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def replies_of(rows: list[dict[str, Any]]) -> tuple[list[Reply], int]:
    """The replies with recorded log-probabilities in `<split>.token_ids.jsonl` rows (a DPO row's rejected one
    too), and how many rows have none. Log-probabilities that do not align 1:1 with the ids: ConfigError."""
    out: list[Reply] = []
    without = 0
    for row in rows:
        sides = [("", turn) for turn in sampled_turns(row)]  # an episode row: each of its turns
        if "rejected_completion_token_ids" in row:
            keys = ("source", "prompt_token_ids", "completion_token_ids", "completion_logprobs")
            rejected = {key: row.get(f"rejected_{key}") for key in keys}
            sides += [("rejected_", turn) for turn in sampled_turns(rejected)]
        for prefix, turn in sides:
            source, prompt, ids = turn.source, turn.prompt_token_ids, turn.completion_token_ids
            logprobs = turn.completion_logprobs
            problem = logprobs_problem(ids, logprobs)
            if problem:
                raise ConfigError(f"{source}: {prefix}{problem}; prepare the data again")
            if prompt is None or ids is None or logprobs is None:
                without += 1
            elif ids:
                out.append(Reply(source, prompt, ids, logprobs))
    return out, without


def compare(replies: list[Reply], recomputed: list[list[float]], without: int = 0) -> LogprobGap:
    """The gap between each reply's recorded log-probabilities and `recomputed` (the trainer's, same order)."""
    gaps: list[float] = []
    worst, where = -1.0, ""
    for reply, new in zip(replies, recomputed, strict=True):
        if len(new) != len(reply.logprobs):
            raise ValueError(f"{reply.source}: {len(new)} recomputed values for {len(reply.logprobs)} recorded")
        for i, (a, b) in enumerate(zip(new, reply.logprobs, strict=True)):
            gaps.append(a - b)
            if abs(a - b) > worst:
                worst, where = abs(a - b), f"{reply.source} token {i}"
    if not gaps:
        return LogprobGap(len(replies), 0, without, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0)
    ratios = [math.exp(min(g, 50.0)) for g in gaps]  # 50: a ratio beyond e^50 is "infinite" for every purpose
    return LogprobGap(
        replies=len(replies),
        tokens=len(gaps),
        without_logprobs=without,
        mean_abs_gap=sum(abs(g) for g in gaps) / len(gaps),
        max_abs_gap=worst,
        ratio_mean=sum(ratios) / len(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        outside=sum(1 for r in ratios if not BAND[0] <= r <= BAND[1]) / len(ratios),
        worst=where,
    )


def verdict(gap: LogprobGap, warn: float = WARN_MEAN_GAP, refuse: float = REFUSE_MEAN_GAP) -> str:
    """ "ok", "warn" or "refuse" for a measured gap (on its mean |gap| per token)."""
    if gap.mean_abs_gap > refuse:
        return "refuse"
    return "warn" if gap.mean_abs_gap > warn else "ok"


def load_model(model_dir: Path, dtype: str) -> Any:
    """The causal LM in `dtype`, in eval mode (train environment: torch, transformers)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    return model.eval()


def recompute(model: Any, reply: Reply) -> list[float]:
    """log p(reply token i | prompt, reply tokens < i) under `model`, in float32 from its logits."""
    import torch

    ids = torch.tensor([reply.prompt_ids + reply.completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(reply.prompt_ids) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(1, torch.tensor(reply.completion_ids, device=logits.device).unsqueeze(1))
    return picked.squeeze(1).tolist()


def measure(dataset_dir: Path, model: Any, samples: int = -1, seed: int = 0, split: str = "train") -> LogprobGap:
    """The gap over `samples` rows (-1 = all, drawn with `seed`) of one split of a prepared dataset."""
    rows = load_token_ids(Path(dataset_dir), split)
    if 0 <= samples < len(rows):
        rows = [rows[i] for i in sorted(random.Random(seed).sample(range(len(rows)), samples))]
    replies, without = replies_of(rows)
    return compare(replies, [recompute(model, r) for r in replies], without)


def check_logprobs(
    dataset_dir: Path,
    model_dir: Path,
    samples: int = -1,
    seed: int = 0,
    dtype: str = "float32",
    split: str = "train",
) -> LogprobGap:
    """Measure the gap with the model at `model_dir` in `dtype`; log it, warn above WARN_MEAN_GAP and raise
    ConfigError above REFUSE_MEAN_GAP."""
    gap = measure(dataset_dir, load_model(model_dir, dtype), samples, seed, split)
    if gap.without_logprobs:
        log.info("log-probability fidelity: %d rows have no recorded log-probabilities", gap.without_logprobs)
    said = f"log-probability fidelity ({split}, {dtype}): {gap.describe()}"
    found = verdict(gap)
    if found == "refuse":
        raise ConfigError(
            f"{said}: the mean gap is above {REFUSE_MEAN_GAP}, so the trainer does not score the tokens as the "
            "policy sampled them: train the weights vLLM served (the same policy version), score with the "
            "model's plain logits (vLLM records them before temperature), or set data.logprob_samples=0 to "
            "train anyway (docs/update.md, Log-probability fidelity)"
        )
    if found == "warn":
        log.warning("%s: the mean gap is above %s (numerics alone stay below it)", said, WARN_MEAN_GAP)
    else:
        log.info("%s", said)
    return gap


def trainer_dtype(recipe: dict[str, Any]) -> str:
    """The precision a LLaMA-Factory YAML computes in: bf16 (HF's flag, or DeepSpeed's torch_autocast on fp32
    parameters: training.recipe.precision), else float32."""
    autocast = "torch_autocast" in (recipe.get("deepspeed") or {})
    return "bfloat16" if recipe.get("bf16") or autocast else "float32"


def check_recipe(recipe: dict[str, Any], samples: int, seed: int = 0) -> LogprobGap:
    """`check_logprobs` on an update's train split (data.logprob_samples): the YAML's dataset and weights (the
    trainer's: a policy version's fp32 copy where it kept one), in the precision the trainer computes in."""
    return check_logprobs(
        Path(recipe["dataset_dir"]), Path(recipe["model_name_or_path"]), samples, seed, trainer_dtype(recipe)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="a prepared dataset folder (train.token_ids.jsonl)")
    parser.add_argument("model", type=Path, help="the Hugging Face model folder the policy was served from")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--samples", type=int, default=-1, help="rows to check (-1 = all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=("train", "val"), default="train")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        gap = check_logprobs(args.dataset, args.model, args.samples, args.seed, args.dtype, args.split)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    print(json.dumps(asdict(gap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
