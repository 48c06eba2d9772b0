"""What a real log-probability mismatch looks like: the trainer divides its logits by a sampling temperature
that vLLM's recorded values do not include (they are the model's raw distribution). Train environment:

    PYTHONPATH=. $BATON_TRAIN_PY -m bench.logprob_mismatch <dataset dir> <model dir> [--temperatures 0.9,0.7]

Prints, per temperature, training.logprob_check's statistics of that mismatch and its verdict (ok, warn or
refuse): the row of docs/update.md's table that the thresholds are set against. bench.logprob_gap runs it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from training.dataset import load_token_ids
from training.logprob_check import Reply, compare, load_model, replies_of, verdict


def scaled(model, reply: Reply, temperature: float) -> list[float]:
    """log p(token) from the logits divided by `temperature` (what a temperature-aware trainer computes)."""
    import torch

    ids = torch.tensor([reply.prompt_ids + reply.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(reply.prompt_ids) - 1 : -1].float() / temperature
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(reply.completion_ids).unsqueeze(1))
    return picked.squeeze(1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.logprob_mismatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("--temperatures", default="0.9,0.7")
    args = parser.parse_args()
    model = load_model(args.model, "float32")
    replies, without = replies_of(load_token_ids(args.dataset, "train"))
    for temperature in (float(t) for t in args.temperatures.split(",")):
        gap = compare(replies, [scaled(model, r, temperature) for r in replies], without)
        print(f"trainer logits / {temperature} vs vLLM: {json.dumps(asdict(gap))} -> {verdict(gap)}")


if __name__ == "__main__":
    main()
