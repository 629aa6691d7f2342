"""The importance-sampled REINFORCE loss."""

from __future__ import annotations

import torch
from rllm_core.algorithms.tensors import fraction, log_ratio, masked, masked_max, masked_mean
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_ppo.plugin import ReinforceLossConfig

__all__ = ["Reinforce"]


class Reinforce:
    """REINFORCE corrected for off-policy samples, per action token, reduced with
    ``ctx.aggregate``::

        ratio = exp(logprobs - old_logprobs)
        loss_t = -sg(min(ratio, ratio_cap)) * A * logprobs

    ``sg`` stops the gradient, so the gradient on a token's logprob is ``-w * A``. When training
    is on-policy the ratio is 1 and this is plain REINFORCE. ``ratio_cap`` (unset by default)
    truncates the weight to bound the variance of stale samples.

    Metrics: ``ratio_mean``, ``ratio_max``, ``capped_fraction`` (action tokens whose weight was
    capped; 0 without a cap).

    References: Williams (1992); truncated importance sampling as in IMPALA, Espeholt et al.
    (arXiv 1802.01561).
    """

    reads_observations = False

    def __init__(self, config: ReinforceLossConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        mask = ctx.action_mask > 0
        with torch.no_grad():
            ratio = torch.exp(log_ratio(ctx.logprobs, ctx.old_logprobs, mask))
            cap = self.config.ratio_cap
            weight = ratio if cap is None else ratio.clamp(max=cap)
        per_token = -weight * masked(ctx.advantages, mask) * masked(ctx.logprobs, mask)
        metrics = {
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            "capped_fraction": fraction(weight != ratio, mask),
        }
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)
