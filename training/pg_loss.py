"""The clipped policy-gradient loss of algorithm=grpo, per token (train environment: torch).

    logp, mask = token_logprobs(logits, labels)                   # [B, T-1] each, shifted as a causal LM predicts
    loss, stats = policy_gradient_loss(logp, behaviour, advantages, mask, settings, normaliser=tokens_in_step)

Per trained token t of a sequence with advantage A (the episode's, training.advantages):

    r_t  = exp(logp_t - behaviour_t)                                (the importance ratio)
    l_t  = -min(r_t * A, clip(r_t, 1 - clip_low, 1 + clip_high) * A)
         + kl_beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)   (k3, Schulman's unbiased KL estimate;
                                                                  at most 10, ref_t - logp_t within +-20: verl's)

`behaviour` are the log-probabilities the rollout sampled with (vLLM's), or with old_logprobs=trainer the trainer's
own before the update (training.pg_trainer), the first term then weighed by `weights` (truncated importance
sampling of the sampler's difference); where a row has none, the trainer passes `logp` detached, so r = 1 and the
term is plain REINFORCE with the advantage. Clipping follows PPO, with DAPO's
decoupled bounds ("clip-higher": a larger upper bound lets unlikely tokens with a positive advantage grow).
Aggregation: `token_mean` sums l_t over every trained token and divides by `normaliser`, the trained tokens of the
whole optimizer step (DAPO: each token weighs the same, so long replies are not down-weighted);
`sequence_mean` averages each sequence's tokens first and divides the sum of those by `normaliser`, the
sequences of the step (GRPO's original).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.config import PolicyGradientConfig

#: torch.Tensor: torch is the train environment's, imported in the functions (the app environment imports this
#: module, and tests/unit/test_declared_deps.py allows module-level imports of the app's packages only)
Tensor = Any

IGNORE_INDEX = -100
#: bounds of the k3 term, verl's ("low_var_kl"): exp(ref - logp) grows without bound where the policy has moved far
#: below the reference on a token (one such token put 1e7 into a loss on the default model); beyond them no gradient
KL_DELTA_BOUND, KL_BOUND = 20.0, 10.0


def token_logprobs(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """log p(label_{t+1} | tokens up to t) at every trained position (0 elsewhere), and the trained positions:
    [B, T-1] each. Only the trained positions' logits are taken to fp32 ([N, V], not [B, T, V])."""
    import torch

    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    chosen = logits[:, :-1][mask].float()
    picked = chosen.gather(-1, targets[mask].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(chosen, dim=-1)
    out = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device)
    return out.masked_scatter(mask, picked), mask


def policy_gradient_loss(
    logp: Tensor,
    behaviour: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyGradientConfig,
    ref_logp: Tensor | None = None,
    normaliser: Tensor | float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one micro-batch (module doc) and its sums for the log: `tokens`, `clipped_low` (tokens whose
    ratio fell below 1 - clip_low with A < 0: no gradient), `clipped_high` (above 1 + clip_high with A > 0),
    `ratio` (sum of r) and `kl` (sum of the k3 terms). `logp`, `behaviour`, `ref_logp`, `mask`: [B, T];
    `advantages`: [B]. `normaliser` None: this micro-batch's own tokens (token_mean) or sequences. `weights`
    ([B, T], no gradient): each token's policy-gradient term times its weight (truncated importance sampling)."""
    import torch

    mask_f = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp((logp - behaviour.detach()) * mask_f)  # 1 off the mask (no overflow from padding)
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if weights is not None:
        per_token = per_token * weights.detach().to(logp.dtype)
    kl = torch.zeros_like(per_token)
    if settings.kl_beta > 0:
        if ref_logp is None:
            raise ValueError("kl_beta > 0 needs the reference model's log-probabilities (ref_logp)")
        delta = torch.clamp((ref_logp.detach() - logp) * mask_f, -KL_DELTA_BOUND, KL_DELTA_BOUND)
        kl = torch.clamp(torch.exp(delta) - delta - 1.0, max=KL_BOUND)
        per_token = per_token + settings.kl_beta * kl
    per_token = per_token * mask_f
    if settings.aggregation == "token_mean":
        total = per_token.sum()
        count = mask_f.sum() if normaliser is None else normaliser
    else:
        lengths = mask_f.sum(-1)
        total = (per_token.sum(-1) / lengths.clamp(min=1.0)).sum()
        count = (lengths > 0).sum() if normaliser is None else normaliser
    loss = total / torch.as_tensor(count, dtype=total.dtype, device=total.device).clamp(min=1.0)
    with torch.no_grad():
        stats = {
            "tokens": mask_f.sum(),
            "clipped_low": ((ratio < 1.0 - settings.clip_low) & (adv < 0) & mask).sum().to(logp.dtype),
            "clipped_high": ((ratio > 1.0 + settings.clip_high) & (adv > 0) & mask).sum().to(logp.dtype),
            "ratio": (ratio * mask_f).sum(),
            "kl": (kl * mask_f).sum(),
        }
    return loss, stats
