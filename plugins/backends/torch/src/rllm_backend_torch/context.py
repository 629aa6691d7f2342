"""The loss context of one micro-batch, with an aggregate bound to the whole call's
normalizers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate as CoreMaskAwareAggregate
from rllm_core.algorithms.aggregation import StepAggregate
from rllm_core.ports import LossContext

__all__ = ["MaskAwareAggregate", "StepNormalizers", "build_context"]


@dataclass(frozen=True, slots=True)
class StepNormalizers:
    """One aggregate per mask, counted over every datum of a ``forward_backward`` call."""

    action: StepAggregate
    observation: StepAggregate


class MaskAwareAggregate(CoreMaskAwareAggregate):
    """The core's mask-aware aggregate, counting the tokens it reduced over: ``selected``
    counts the tokens the masks it was given selected since the last :meth:`reset`; the
    backend weighs a loss's metrics across micro-batches by it.
    """

    def __init__(
        self,
        normalizers: StepNormalizers,
        *,
        action_mask: torch.Tensor,
        observation_mask: torch.Tensor,
        action_tokens: int,
        observation_tokens: int,
    ) -> None:
        super().__init__(
            action=normalizers.action,
            observation=normalizers.observation,
            action_mask=action_mask,
            observation_mask=observation_mask,
        )
        self._counts = {id(action_mask): action_tokens, id(observation_mask): observation_tokens}
        self.selected = 0

    def reset(self) -> None:
        self.selected = 0

    def __call__(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        count = self._counts.get(id(mask))
        self.selected += int((mask != 0).sum()) if count is None else count
        return super().__call__(values, mask)


def build_context(
    *,
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    observation_mask: torch.Tensor,
    normalizers: StepNormalizers,
    action_tokens: int,
    observation_tokens: int,
) -> tuple[LossContext, MaskAwareAggregate]:
    """A :class:`LossContext` whose ``old_logprobs`` are ``logprobs`` detached (the weights do
    not change within an optimizer step), and its aggregate."""
    aggregate = MaskAwareAggregate(
        normalizers,
        action_mask=action_mask,
        observation_mask=observation_mask,
        action_tokens=action_tokens,
        observation_tokens=observation_tokens,
    )
    context = LossContext(
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        rollout_logprobs=rollout_logprobs,
        advantages=advantages,
        action_mask=action_mask,
        observation_mask=observation_mask,
        aggregate=aggregate,
    )
    return context, aggregate
