"""The ECHO auxiliary loss: the policy also learns to predict what the environment says."""

from __future__ import annotations

import torch
from rllm_core.ports import LossContext, LossOutput

from rllm_loss_echo.plugin import EchoConfig

__all__ = ["Echo"]


class Echo:
    """Negative log-likelihood of environment-observation tokens::

        loss = aggregate(-logprobs, observation_mask)

    Observation tokens (tool and terminal output after the first prompt) are text the policy
    conditions on but did not sample; predicting them adds a learning signal from tokens a
    policy loss ignores, at no extra forward pass. The loss does not scale itself: the run
    loop multiplies it by ``coef`` from the config (default 0.05) and adds it to the policy
    loss, so a coefficient of 0 leaves the policy loss unchanged. Tokens outside the
    observation mask get exactly zero gradient.

    Metrics: ``nll`` (unweighted mean of ``-logprobs`` over observation tokens) and
    ``observation_tokens`` (their count in this micro-batch).

    Reference: ECHO (arXiv 2605.24517).
    """

    def __init__(self, config: EchoConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        mask = ctx.observation_mask > 0
        nll = torch.where(mask, -ctx.logprobs, torch.zeros_like(ctx.logprobs))
        selected = nll.detach()[mask].double()
        metrics = {
            "nll": float(selected.mean()) if selected.numel() else 0.0,
            "observation_tokens": float(selected.numel()),
        }
        return LossOutput(loss=ctx.aggregate(nll, ctx.observation_mask), metrics=metrics)
