"""Divergence PPO: a trust region on the sampled token's divergence instead of ratio clipping."""

from __future__ import annotations

from collections.abc import Callable

import torch
from rllm_core.algorithms.tensors import fraction, log_ratio, masked, masked_max, masked_mean
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_dppo.divergence import binary_kl, binary_tv
from rllm_loss_dppo.plugin import DPPOKLConfig, DPPOTVConfig

__all__ = ["DPPOKL", "DPPOTV"]

Divergence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _DivergencePPO:
    """The loss both variants share; a subclass names its divergence."""

    divergence: Divergence

    def __init__(self, config: DPPOTVConfig | DPPOKLConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        mask = ctx.action_mask > 0
        lr = log_ratio(ctx.logprobs, ctx.rollout_logprobs, mask)
        ratio = torch.exp(lr)
        advantages = masked(ctx.advantages, mask)
        with torch.no_grad():
            divergence = masked(self.divergence(ctx.logprobs, ctx.rollout_logprobs), mask)
            moving_away = ((advantages > 0) & (lr > 0)) | ((advantages < 0) & (lr < 0))
            blocked = mask & moving_away & (divergence > self.config.delta)
        metrics = {
            "masked_fraction": fraction(blocked, mask),
            "divergence_mean": masked_mean(divergence, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
        }
        cap = self.config.ratio_cap
        if cap is not None:
            # The factor is exactly 1 at or below the cap, so those ratios are left bit-for-bit.
            ratio = ratio * (cap / ratio).clamp(max=1.0).detach()
        per_token = masked(-ratio * advantages, ~blocked)
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)


class DPPOTV(_DivergencePPO):
    """DPPO-Binary-TV, per action token, reduced with ``ctx.aggregate``::

        ratio = exp(logprobs - rollout_logprobs)        (with gradient)
        p = exp(logprobs), q = exp(rollout_logprobs)    (no gradient)
        masked  = ((A > 0 and ratio > 1) or (A < 0 and ratio < 1)) and |p - q| > delta
        loss_t  = 0 if masked else -ratio * A

    There is no ratio clipping. A token is masked (gets no gradient) only when the update would
    push it further from the ROLLOUT policy and its probability has already moved more than
    ``delta`` in total variation; moving back toward the rollout policy is never blocked. Unlike
    a ratio, |p - q| does not over-penalize rare tokens (1e-5 -> 1e-3 is a ratio of 100 but a
    TV of 0.001) nor under-penalize likely ones (0.98 -> 0.82 stays within PPO's 0.2 ratio
    range but is a TV of 0.16). Defaults: delta = 0.15, no ratio cap.

    Metrics: ``masked_fraction`` (action tokens masked), ``divergence_mean`` (mean |p - q| over
    action tokens), ``ratio_mean``, ``ratio_max`` (before any cap).

    Reference: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning"
    (arXiv 2602.04879).
    """

    divergence = staticmethod(binary_tv)

    def __init__(self, config: DPPOTVConfig) -> None:
        super().__init__(config)


class DPPOKL(_DivergencePPO):
    """DPPO-Binary-KL, per action token, reduced with ``ctx.aggregate``::

        ratio = exp(logprobs - rollout_logprobs)        (with gradient)
        p = exp(logprobs), q = exp(rollout_logprobs)    (no gradient)
        D = p * log(p / q) + (1 - p) * log((1 - p) / (1 - q))
        masked  = ((A > 0 and ratio > 1) or (A < 0 and ratio < 1)) and D > delta
        loss_t  = 0 if masked else -ratio * A

    The same rule as ``dppo-tv`` with the binary KL divergence (computed with floors on
    1 - p and 1 - q, so probabilities of 1 stay finite). For small moves
    D ~ (p - q)^2 / (2 q (1 - q)), so it is stricter than TV on tokens whose rollout
    probability is near 0 or 1. Defaults: delta = 0.05, no ratio cap.

    Metrics: ``masked_fraction``, ``divergence_mean`` (mean binary KL over action tokens),
    ``ratio_mean``, ``ratio_max`` (before any cap).

    Reference: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning"
    (arXiv 2602.04879).
    """

    divergence = staticmethod(binary_kl)

    def __init__(self, config: DPPOKLConfig) -> None:
        super().__init__(config)
