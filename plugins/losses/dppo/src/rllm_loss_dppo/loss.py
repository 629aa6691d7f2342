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
    """The loss both variants share; a subclass names its divergence.

    The old policy is ``ctx.old_logprobs``: the rollout (sampler) logprobs by default, or the
    trainer's logprobs recomputed at the start of the step when the plan asks for them. The
    ratio and the divergence are both taken against it, as in the reference implementation.
    There is no ratio clipping: a token is masked (gets no gradient) only when the update pushes
    it further from the old policy (up for ``A > 0``, down otherwise) and it has already moved
    more than ``delta``; moving back toward the old policy is never blocked. Masked tokens still
    count in the aggregation's normalizers, as clipped tokens do in PPO.

    Value convention: the loss value is the reference implementation's,
    ``-A * sg(w) * logprobs``. Its gradient per kept token, ``-A * w``, is that of the ratio
    surrogate ``-A * min(ratio, ratio_cap)``; the value itself is not the surrogate's.
    """

    divergence: Divergence
    reads_observations = False

    def __init__(self, config: DPPOTVConfig | DPPOKLConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        mask = ctx.action_mask > 0
        with torch.no_grad():
            lr = log_ratio(ctx.logprobs, ctx.old_logprobs, mask)
            ratio = torch.exp(lr)
            advantages = masked(ctx.advantages, mask)
            divergence = masked(self.divergence(ctx.logprobs, ctx.old_logprobs), mask)
            # The sign of the advantage says which way the update pushes the token.
            moving_away = torch.where(advantages > 0, lr > 0, lr < 0)
            blocked = mask & moving_away & (divergence > self.config.delta)
            cap = self.config.ratio_cap
            weight = ratio if cap is None else ratio.clamp(max=cap)
        metrics = {
            "masked_fraction": fraction(blocked, mask),
            "divergence_mean": masked_mean(divergence, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
        }
        per_token = -weight * advantages * masked(ctx.logprobs, mask & ~blocked)
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)


class DPPOTV(_DivergencePPO):
    """DPPO-Binary-TV, per action token, reduced with ``ctx.aggregate``::

        ratio  = exp(logprobs - old_logprobs)           (log-ratio clamped to +-20)
        w      = min(ratio, ratio_cap)                  (ratio when unset; no gradient)
        p = exp(logprobs), q = exp(old_logprobs)        (no gradient)
        masked = p - q > delta   if A > 0
                 q - p > delta   otherwise
        loss_t = 0 if masked else -A * sg(w) * logprobs

    The old policy, the masking rule and the value convention are :class:`_DivergencePPO`'s.

    Unlike a ratio, |p - q| does not over-penalize rare tokens (1e-5 -> 1e-3 is a ratio of 100
    but a TV of 0.001) nor under-penalize likely ones (0.98 -> 0.82 stays within PPO's 0.2
    ratio range but is a TV of 0.16). Defaults: delta = 0.15, no ratio cap.

    Metrics: ``masked_fraction`` (action tokens masked), ``divergence_mean`` (mean |p - q| over
    action tokens), ``ratio_mean``, ``ratio_max`` (before any cap).

    Reference: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning"
    (arXiv 2602.04879), as implemented by verl's ``dppo_tv`` policy loss.
    """

    divergence = staticmethod(binary_tv)

    def __init__(self, config: DPPOTVConfig) -> None:
        super().__init__(config)


class DPPOKL(_DivergencePPO):
    """DPPO-Binary-KL, per action token, reduced with ``ctx.aggregate``::

        ratio  = exp(logprobs - old_logprobs)           (log-ratio clamped to +-20)
        w      = min(ratio, ratio_cap)                  (ratio when unset; no gradient)
        p = exp(logprobs), q = exp(old_logprobs)        (no gradient)
        D      = q * log(q / p) + (1 - q) * log((1 - q + 1e-8) / (1 - p + 1e-8))
                                                        (binary KL(old || current))
        masked = D > delta and (p > q if A > 0 else p < q)
        loss_t = 0 if masked else -A * sg(w) * logprobs

    The old policy, the masking rule and the value convention are :class:`_DivergencePPO`'s.

    For small moves D ~ (p - q)^2 / (2 q (1 - q)), so it is stricter than TV on tokens whose
    old probability is near 0 or 1. Defaults: delta = 0.05, no ratio cap.

    Metrics: ``masked_fraction``, ``divergence_mean`` (mean binary KL over action tokens),
    ``ratio_mean``, ``ratio_max`` (before any cap).

    Reference: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning"
    (arXiv 2602.04879), as implemented by verl's ``dppo_kl`` policy loss.
    """

    divergence = staticmethod(binary_kl)

    def __init__(self, config: DPPOKLConfig) -> None:
        super().__init__(config)
