"""The CISPO loss: a clipped, detached importance weight on the REINFORCE gradient."""

from __future__ import annotations

import torch
from rllm_core.algorithms.tensors import fraction, log_ratio, masked, masked_max, masked_mean
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_ppo.plugin import CISPOConfig

__all__ = ["CISPO"]


class CISPO:
    """Clipped IS-weight policy optimization, per action token, reduced with ``ctx.aggregate``::

        ratio = exp(logprobs - old_logprobs)
        loss_t = -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logprobs

    ``sg`` stops the gradient: every token keeps a gradient ``-w * A`` on its logprob, with the
    weight ``w`` bounded, instead of PPO dropping the tokens whose ratio left the range.
    Defaults: eps_low = 1.0 (no lower bound, as in MiniMax-M1), eps_high = 0.28.

    Metrics: ``clip_fraction`` (action tokens whose weight was clipped), ``ratio_mean``,
    ``ratio_max``.

    Reference: MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention" (arXiv 2506.13585).
    """

    reads_observations = False

    def __init__(self, config: CISPOConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        cfg = self.config
        mask = ctx.action_mask > 0
        with torch.no_grad():
            ratio = torch.exp(log_ratio(ctx.logprobs, ctx.old_logprobs, mask))
            weight = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
        per_token = -weight * masked(ctx.advantages, mask) * masked(ctx.logprobs, mask)
        metrics = {
            "clip_fraction": fraction(weight != ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
        }
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)
