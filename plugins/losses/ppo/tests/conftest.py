"""Builds loss contexts from plain lists for the hand-computed loss tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from rllm_core.algorithms.aggregation import make_aggregate, step_normalizers
from rllm_core.ports import LossContext

ContextFactory = Callable[..., tuple[LossContext, torch.Tensor]]


@pytest.fixture
def make_ctx() -> ContextFactory:
    """``make_ctx(logprobs, old_logprobs=..., advantages=..., action_mask=...)`` returns the
    context and the ``logprobs`` leaf tensor (float64, requires grad). ``old_logprobs`` and
    ``rollout_logprobs`` default to each other, then to the detached logprobs; the aggregate
    is ``mode`` over this one micro-batch's action mask."""

    def build(
        logprobs: list[list[float]],
        *,
        advantages: list[list[float]],
        action_mask: list[list[float]],
        old_logprobs: list[list[float]] | None = None,
        rollout_logprobs: list[list[float]] | None = None,
        observation_mask: list[list[float]] | None = None,
        mode: str = "token-mean",
        norm_length: float | None = None,
    ) -> tuple[LossContext, torch.Tensor]:
        leaf = torch.tensor(logprobs, dtype=torch.float64, requires_grad=True)
        old = old_logprobs if old_logprobs is not None else rollout_logprobs
        rollout = rollout_logprobs if rollout_logprobs is not None else old_logprobs
        mask = torch.tensor(action_mask, dtype=torch.float64)
        tokens, sequences = step_normalizers([mask])
        ctx = LossContext(
            logprobs=leaf,
            old_logprobs=torch.tensor(old, dtype=torch.float64)
            if old is not None
            else leaf.detach().clone(),
            rollout_logprobs=torch.tensor(rollout, dtype=torch.float64)
            if rollout is not None
            else leaf.detach().clone(),
            advantages=torch.tensor(advantages, dtype=torch.float64),
            action_mask=mask,
            observation_mask=torch.tensor(observation_mask, dtype=torch.float64)
            if observation_mask is not None
            else torch.zeros_like(mask),
            aggregate=make_aggregate(
                mode, total_tokens=tokens, total_sequences=sequences, norm_length=norm_length
            ),
        )
        return ctx, leaf

    return build
