"""REINFORCE with a clamped importance weight and a KL term anchored on the sampler."""

from __future__ import annotations

import torch
from rllm_core.algorithms.reference_kl import kl_estimate
from rllm_core.algorithms.tensors import (
    fraction,
    log_ratio,
    masked,
    masked_max,
    masked_mean,
    masked_min,
)
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_ppo.plugin import ReinforceKLConfig

__all__ = ["ReinforceKL"]


class ReinforceKL:
    """Importance-sampled REINFORCE plus a KL to the sampler's policy, per action token::

        ratio  = exp(logprobs - old_logprobs)                    (log-ratio clamped to +-20)
        w      = clamp(ratio, ratio_clamp_min, ratio_clamp_max)  (no gradient; unset: no bound)
        log r  = logprobs - rollout_logprobs      direction = "backward": KL(policy || sampler)
                 rollout_logprobs - logprobs      direction = "forward":  KL(sampler || policy)
                                                  (clamped to +-20)
        kl_t   = kl_approx(log r)                 k1, k2, k3 or low-var-kl of
                                                  rllm_core.algorithms.reference_kl
        loss_t = -sg(w) * A * logprobs + kl_coef * kl_t

    reduced with ``ctx.aggregate`` over the action tokens, in the mode the config pins
    (``aggregation``) or else the run's. The KL is anchored on ``rollout_logprobs``, the
    sampler's, whatever the ratio's denominator (``old_logprobs``) is; its gradient flows
    through ``logprobs``. Beyond the +-20 clamp a token's KL is constant (no gradient), as a
    ratio's is.

    Metrics: ``ratio_mean``, ``ratio_min``, ``ratio_max`` (before the clamp),
    ``clamped_fraction`` (action tokens whose weight was clamped), ``kl_mean`` (mean ``kl_t``
    over action tokens) and ``kl_seq_mean`` (mean over sequences of their summed ``kl_t``,
    the sequence-level KL by the chain rule).
    """

    reads_observations = False

    def __init__(self, config: ReinforceKLConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        cfg = self.config
        mask = ctx.action_mask > 0
        with torch.no_grad():
            ratio = torch.exp(log_ratio(ctx.logprobs, ctx.old_logprobs, mask))
            bounded = cfg.ratio_clamp_min is not None or cfg.ratio_clamp_max is not None
            weight = (
                ratio.clamp(min=cfg.ratio_clamp_min, max=cfg.ratio_clamp_max) if bounded else ratio
            )
        sampler = log_ratio(ctx.logprobs, ctx.rollout_logprobs, mask)
        signed = sampler if cfg.direction == "backward" else -sampler
        kl = masked(kl_estimate(signed, torch.zeros_like(signed), cfg.kl_approx), mask)
        per_token = -weight * masked(ctx.advantages, mask) * masked(ctx.logprobs, mask)
        if cfg.kl_coef:
            per_token = per_token + cfg.kl_coef * kl
        sequences = ctx.action_mask.sum(dim=-1) > 0
        metrics = {
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_min": masked_min(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            "clamped_fraction": fraction(weight != ratio, mask),
            "kl_mean": masked_mean(kl, mask),
            "kl_seq_mean": masked_mean(
                ctx.seq_reduce(kl.detach(), ctx.action_mask, "sum"), sequences
            ),
        }
        if cfg.aggregation is None:
            loss = ctx.aggregate(per_token, ctx.action_mask)
        else:
            loss = ctx.aggregate(per_token, ctx.action_mask, mode=cfg.aggregation)
        return LossOutput(loss=loss, metrics=metrics)
