"""The GSPO loss: PPO's clipped surrogate on a sequence-level ratio."""

from __future__ import annotations

import torch
from rllm_core.algorithms.tensors import LOG_RATIO_LIMIT, fraction, masked, masked_max, masked_mean
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_ppo.plugin import GSPOConfig

__all__ = ["GSPO"]


class GSPO:
    """Group sequence policy optimization, reduced with ``ctx.aggregate``::

        s = exp(mean over the sequence's action tokens of (logprobs - old_logprobs))
        loss_t = max(-A_t * s, -A_t * clip(s, 1 - eps_low, 1 + eps_high))   for each action token t

    ``s`` is the geometric mean of the sequence's token ratios and carries the gradient of every
    one of its tokens; it is the same for all tokens of a row. With per-sequence advantages and
    ``seq-mean-token-mean`` aggregation this is exactly the paper's sequence objective. With
    per-sequence advantages it also has the value and gradient, in every aggregation mode, of
    the paper's GSPO-token form ``sg(s) * exp(logprobs_t - sg(logprobs_t))`` that verl uses;
    with advantages varying inside a row, GSPO-token weights each token by its own advantage
    and this loss by the row's mean. A row with no action token has ``s = 1`` and contributes
    nothing. The mean log-ratio is clamped to +-20 before ``exp``. Defaults: eps_low = 3e-4,
    eps_high = 4e-4 (the paper's).

    Metrics: ``clip_fraction`` (action tokens where the clipped term is the larger),
    ``ratio_mean`` and ``ratio_max`` (over rows with at least one action token).

    Reference: Zheng et al., "Group Sequence Policy Optimization" (arXiv 2507.18071).
    """

    reads_observations = False

    def __init__(self, config: GSPOConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        cfg = self.config
        mask = ctx.action_mask > 0
        diff = masked(ctx.logprobs - ctx.old_logprobs.detach(), mask)
        counts = mask.sum(dim=-1)
        mean_log_ratio = diff.sum(dim=-1) / counts.clamp(min=1).to(diff.dtype)
        seq_ratio = torch.exp(mean_log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
        ratio = seq_ratio.unsqueeze(-1).expand_as(diff)
        advantages = masked(ctx.advantages, mask)
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
        per_token = torch.maximum(unclipped, clipped)
        rows = counts > 0
        metrics = {
            "clip_fraction": fraction(clipped > unclipped, mask),
            "ratio_mean": masked_mean(seq_ratio, rows),
            "ratio_max": masked_max(seq_ratio, rows),
        }
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)
