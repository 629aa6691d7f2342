"""The PPO clipped surrogate loss."""

from __future__ import annotations

import torch
from rllm_core.algorithms.tensors import fraction, log_ratio, masked, masked_max, masked_mean
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_ppo.plugin import PPOClipConfig

__all__ = ["PPOClip"]


class PPOClip:
    """PPO's clipped surrogate, per action token, reduced with ``ctx.aggregate``::

        ratio = exp(logprobs - old_logprobs)
        loss_t = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
        with dual clip c, where A < 0:  loss_t = min(loss_t, -c * A)

    The clip makes the loss flat (zero gradient) once the ratio has moved past the range in
    the direction the advantage favours; the dual clip bounds the loss of a negative-advantage
    token whose ratio exploded. Defaults: eps_low = eps_high = 0.2, no dual clip; DAPO's
    clip-higher sets eps_high = 0.28.

    Metrics: ``clip_fraction`` (action tokens where the clipped term is the larger, so no
    gradient flows), ``dual_clip_fraction`` (only with dual clip), ``ratio_mean``, ``ratio_max``.

    References: Schulman et al., "Proximal Policy Optimization Algorithms" (arXiv 1707.06347);
    Ye et al., dual-clip PPO (arXiv 1912.09729); Yu et al., DAPO (arXiv 2503.14476).
    """

    reads_observations = False

    def __init__(self, config: PPOClipConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        cfg = self.config
        mask = ctx.action_mask > 0
        ratio = torch.exp(log_ratio(ctx.logprobs, ctx.old_logprobs, mask))
        advantages = masked(ctx.advantages, mask)
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
        per_token = torch.maximum(unclipped, clipped)
        metrics = {"clip_fraction": fraction(clipped > unclipped, mask)}
        if cfg.dual_clip_c is not None:
            bound = -advantages * cfg.dual_clip_c
            dual = (advantages < 0) & (per_token > bound)
            per_token = torch.where(dual, bound, per_token)
            metrics["dual_clip_fraction"] = fraction(dual, mask)
        metrics["ratio_mean"] = masked_mean(ratio, mask)
        metrics["ratio_max"] = masked_max(ratio, mask)
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics=metrics)
