"""The ``reinforce-tis`` loss.

For every action token ``t``, with ``lp`` the current policy's logprob, ``lr`` the logprob the
sampler recorded (rollout), ``A`` the advantage, ``c`` the cap and ``beta`` the KL coefficient::

    w(t)  = min(exp(lp(t) - lr(t)), c)        importance weight, truncated; no gradient
    d(t)  = lr(t) - lp(t)
    kl(t) = exp(d(t)) - d(t) - 1              k3 estimate of KL(current || rollout), >= 0
    l(t)  = -w(t) * A(t) * lp(t) + beta * kl(t)

    loss  = aggregate(l, action_mask)

The weight corrects for the tokens having been sampled by the rollout policy rather than the
current one; truncating it at ``c`` bounds the variance that a large ratio would bring. ``d`` is
clamped to [-20, 20] before ``exp`` so that the penalty stays finite in float32 and bfloat16;
beyond that range the penalty stops pushing, which only happens once the two policies are
already far apart.
"""

from __future__ import annotations

import math

import torch
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_example.plugin import ReinforceTISConfig

_MAX_LOG_GAP = 20.0


class ReinforceTIS:
    """A :class:`rllm_core.ports.Loss` built from a :class:`ReinforceTISConfig`."""

    def __init__(self, config: ReinforceTISConfig) -> None:
        self.config = config
        self._log_cap = math.log(config.cap)

    def __call__(self, ctx: LossContext) -> LossOutput:
        log_ratio = (ctx.logprobs - ctx.rollout_logprobs).detach()
        weight = torch.exp(log_ratio.clamp(max=self._log_cap))
        gap = (ctx.rollout_logprobs - ctx.logprobs).clamp(-_MAX_LOG_GAP, _MAX_LOG_GAP)
        kl = torch.exp(gap) - gap - 1.0
        per_token = -weight * ctx.advantages * ctx.logprobs + self.config.beta * kl
        loss = ctx.aggregate(per_token, ctx.action_mask)

        with torch.no_grad():
            selected = ctx.action_mask != 0
            tokens = max(int(selected.sum().item()), 1)
            metrics = {
                "weight_mean": weight[selected].sum().item() / tokens,
                "truncated_frac": (log_ratio[selected] > self._log_cap).sum().item() / tokens,
                "kl": kl[selected].sum().item() / tokens,
            }
        return LossOutput(loss=loss, metrics=metrics)
