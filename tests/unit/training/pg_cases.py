"""Run in the train environment (torch, LLaMA-Factory): the policy-gradient loss, log-probabilities and collator on
the hand-made inputs of tests/unit/training/test_pg_loss.py, which holds the hand-computed answers.

    python tests/unit/training/pg_cases.py    # prints `RESULT {...}`

Two sequences of four trained-or-not positions (already shifted as training.pg_loss.token_logprobs gives them):
sequence 0 has advantage +1 and ratios 1.5, 0.5, 1.0 on its three trained tokens (its fourth position is not
trained, and has a wild log-probability that must change nothing); sequence 1 has advantage -1 and ratios 0.5, 1.2
on two trained tokens.
"""

from __future__ import annotations

import json
import math

# torch is the train environment's: imported in the functions (the unit tests' app environment imports this file's
# package, and tests/unit/test_declared_deps.py checks module-level imports)
from training.config import PolicyGradientConfig
from training.pg_loss import policy_gradient_loss, token_logprobs
from training.pg_trainer import PolicyGradientCollator, get_sampler_order, rows_reached

MASK = [[True, True, True, False], [True, True, False, False]]
RATIOS = [[1.5, 0.5, 1.0, 1.0], [0.5, 1.2, 1.0, 1.0]]
ADVANTAGES = [1.0, -1.0]
#: the new log-probabilities; the untrained position of sequence 0 is far from its behaviour value
LOGP = [[-1.0, -2.0, -0.5, 40.0], [-1.5, -0.7, -3.0, -3.0]]
#: the reference's log-probabilities: log 2 above the new one at sequence 0's first token, equal elsewhere
REF_SHIFT = [[math.log(2.0), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


#: truncated importance weights (old_logprobs=trainer); the untrained position's must change nothing
WEIGHTS = [[2.0, 0.5, 1.0, 99.0], [1.0, 1.5, 1.0, 1.0]]


def loss_case(settings: PolicyGradientConfig, normaliser: float | None = None, weighted: bool = False) -> dict:
    """The loss, d loss / d logp and the stats on the two sequences above (each token weighed by WEIGHTS)."""
    import torch

    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor(LOGP, dtype=torch.float64) - torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    behaviour[0, 3] = -5.0  # the untrained position: a ratio of e^45 were it counted
    ref = torch.tensor(LOGP, dtype=torch.float64) + torch.tensor(REF_SHIFT, dtype=torch.float64)
    mask = torch.tensor(MASK)
    loss, stats = policy_gradient_loss(
        logp,
        behaviour,
        torch.tensor(ADVANTAGES),
        mask,
        settings,
        ref_logp=ref,
        normaliser=normaliser,
        weights=torch.tensor(WEIGHTS, dtype=torch.float64) if weighted else None,
    )
    loss.backward()
    return {"loss": loss.item(), "grad": logp.grad.tolist(), "stats": {k: float(v) for k, v in stats.items()}}


def kl_bound_case() -> dict:
    """One token 30 nats below its reference: k3 = e^30 - 31 were it not bounded; bounded, 10 and no gradient."""
    import torch

    logp = torch.tensor([[-31.0]], dtype=torch.float64, requires_grad=True)
    settings = PolicyGradientConfig(kl_beta=1.0)
    ref = torch.tensor([[-1.0]], dtype=torch.float64)
    loss, stats = policy_gradient_loss(logp, logp.detach(), torch.tensor([0.0]), torch.tensor([[True]]), settings, ref)
    loss.backward()
    return {"loss": loss.item(), "kl": float(stats["kl"]), "grad": logp.grad.item()}


def logprob_case() -> dict:
    """token_logprobs against log_softmax on a 3-token vocabulary: labels shifted, -100 positions zero."""
    import torch

    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [3.0, 1.0, -1.0], [5.0, 5.0, 5.0]]])
    labels = torch.tensor([[-100, 2, 0, -100]])
    logp, mask = token_logprobs(logits, labels)
    return {"logp": logp.tolist(), "mask": mask.tolist()}


def collator_case() -> dict:
    """The collator wrapper around a stand-in for LLaMA-Factory's collator (right padding with -100 labels)."""
    import torch

    def pad(features: list[dict]) -> dict:
        width = max(len(f["labels"]) for f in features)
        labels = [f["labels"] + [-100] * (width - len(f["labels"])) for f in features]
        ids = [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}

    features = [
        # prompt 10 11, sampled 5 6 2 (2 = <|im_end|>), then the template's 198 (not sampled: not trained)
        {"input_ids": [10, 11, 5, 6, 2, 198], "labels": [-100, -100, 5, 6, 2, 198], "pg_advantage": 0.5,
         "pg_policy_tokens": [3], "pg_logprobs": [-0.1, -0.2, -0.3], "pg_row": 7},
        # a row without sampled ids (-1: every label trains) nor log-probabilities
        {"input_ids": [12, 7, 2, 198], "labels": [-100, 7, 2, 198], "pg_advantage": -0.5,
         "pg_policy_tokens": [-1], "pg_logprobs": [], "pg_row": 3},
    ]  # fmt: skip
    batch = PolicyGradientCollator(pad)(features)
    return {key: value.tolist() for key, value in batch.items()}


def episode_collator_case() -> dict:
    """An episode row of two turns (training.episodes): each turn's sampled tokens trained, each turn's "\\n" (198)
    after its <|im_end|> (2) not, and the turns' behaviour log-probabilities one after the other."""
    import torch

    def pad(features: list[dict]) -> dict:
        return {
            "input_ids": torch.tensor([f["input_ids"] for f in features]),
            "labels": torch.tensor([f["labels"] for f in features]),
        }

    features = [
        {"input_ids": [10, 5, 2, 198, 11, 6, 7, 2, 198], "labels": [-100, 5, 2, 198, -100, 6, 7, 2, 198],
         "pg_advantage": 1.0, "pg_policy_tokens": [2, 3], "pg_logprobs": [-0.1, -0.2, -0.3, -0.4, -0.5],
         "pg_row": 0},
    ]  # fmt: skip
    batch = PolicyGradientCollator(pad)(features)
    return {key: value.tolist() for key, value in batch.items()}


def sampler_case(processes: int, steps: int, total: int = 20, size: int = 2) -> dict:
    """What `steps` micro-batches of each of `processes` processes trained (accelerate's loaders, prepared as the
    HF Trainer prepares them: a seedable sampler, each process dealt every processes-th batch), and what
    rows_reached foresaw from the order replayed once the first batch was out."""
    import torch
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    torch.manual_seed(1234)
    trained: list[int] = []
    foreseen: dict[int, list[int]] = {}
    for index in range(processes):
        loader = prepare_data_loader(
            DataLoader(list(range(total)), batch_size=size, shuffle=True),
            num_processes=processes,
            process_index=index,
            use_seedable_sampler=True,
        )
        batches = iter(loader)
        first = next(batches).tolist()
        order = get_sampler_order(loader, total)
        reach = steps * size * processes
        foreseen[index] = rows_reached(order, first, total=total, size=size, reach=reach, process_index=index)
        trained += first + [row for _ in range(steps - 1) for row in next(batches).tolist()]
    return {"trained": sorted(trained), "foreseen": {str(k): v for k, v in foreseen.items()}}


def main() -> None:
    token = PolicyGradientConfig(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.0)
    sequence = PolicyGradientConfig(clip_low=0.2, clip_high=0.28, aggregation="sequence_mean", kl_beta=0.0)
    kl = PolicyGradientConfig(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.1)
    result = {
        "token_mean": loss_case(token),
        "token_mean_step": loss_case(token, normaliser=10.0),
        "weighted": loss_case(token, weighted=True),
        "sequence_mean": loss_case(sequence),
        "kl": loss_case(kl),
        "kl_bound": kl_bound_case(),
        "logprobs": logprob_case(),
        "collator": collator_case(),
        "episode_collator": episode_collator_case(),
        "sampler_one": sampler_case(processes=1, steps=3),
        "sampler_two": sampler_case(processes=2, steps=2),
        "sampler_epoch": sampler_case(processes=2, steps=5),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
