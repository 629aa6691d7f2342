"""Run rllm-core losses on the logprobs Tinker's forward pass returns.

Tinker's ``forward_backward_custom`` sends the datums through a forward pass, hands the
per-datum target logprobs to a client-side function as leaf tensors, and back-propagates that
function's gradient with respect to the logprobs through the model. :class:`CustomLoss` is
that function: it builds one :class:`~rllm_core.ports.LossContext` over the whole call, sums
the policy loss and the weighted auxiliary losses, and records their metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate, step_normalizers
from rllm_core.ports import Loss, LossContext, LossOutput

from rllm_backend_tinker.batch import Batch, logprobs_matrix

__all__ = ["CustomLoss", "active_aux_losses"]


class CustomLoss:
    """The ``loss_fn`` given to ``TrainingClient.forward_backward_custom`` for one call.

    ``old_logprobs`` are the current logprobs detached (the weights do not change within an
    optimizer step). After Tinker calls it, :attr:`metrics` holds ``loss`` (the total),
    ``<name>/loss`` and ``<name>/<metric>`` for each loss, and the counts ``tokens``,
    ``sequences``, ``action_tokens`` and ``observation_tokens``.
    """

    def __init__(
        self,
        batch: Batch,
        losses: Sequence[tuple[Loss, float]],
        names: Sequence[str],
        *,
        aggregation: str,
        norm_length: float | None,
    ) -> None:
        self.batch = batch
        self.losses = list(losses)
        self.names = list(names)
        self.aggregation = aggregation
        self.norm_length = norm_length
        self.metrics: dict[str, float] = {}

    def __call__(
        self, data: Sequence[Any], logprobs_list: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = self.batch
        action_tokens, action_sequences = step_normalizers([batch.action_mask])
        observation_tokens, observation_sequences = step_normalizers([batch.observation_mask])
        aggregate = MaskAwareAggregate(
            action=make_aggregate(
                self.aggregation,
                total_tokens=action_tokens,
                total_sequences=action_sequences,
                norm_length=self.norm_length,
            ),
            observation=make_aggregate(
                self.aggregation,
                total_tokens=observation_tokens,
                total_sequences=observation_sequences,
                norm_length=self.norm_length,
            ),
            action_mask=batch.action_mask,
            observation_mask=batch.observation_mask,
        )
        logprobs = logprobs_matrix(logprobs_list, batch)
        context = LossContext(
            logprobs=logprobs,
            old_logprobs=logprobs.detach(),
            rollout_logprobs=batch.rollout_logprobs,
            advantages=batch.advantages,
            action_mask=batch.action_mask,
            observation_mask=batch.observation_mask,
            aggregate=aggregate,
        )
        metrics: dict[str, float] = {}
        total: torch.Tensor | None = None
        for (component, coef), name in zip(self.losses, self.names, strict=True):
            output = component(context)
            value = _checked_loss(output, name)
            for key, metric in output.metrics.items():
                metrics[f"{name}/{key}"] = float(metric)
            metrics[f"{name}/loss"] = float(value.detach())
            total = value if total is None else total + coef * value
        assert total is not None
        metrics["loss"] = float(total.detach())
        metrics["tokens"] = float(sum(batch.lengths))
        metrics["sequences"] = float(batch.size)
        metrics["action_tokens"] = float(action_tokens)
        metrics["observation_tokens"] = float(observation_tokens)
        self.metrics = metrics
        return total, dict(metrics)


def active_aux_losses(aux_losses: Sequence[tuple[Loss, float]]) -> list[tuple[Loss, float]]:
    """The auxiliary losses with a nonzero coefficient; raises ``ValueError`` for a
    coefficient that is not a finite number."""
    active = []
    for index, (aux, coef) in enumerate(aux_losses):
        if isinstance(coef, bool) or not isinstance(coef, int | float) or not math.isfinite(coef):
            raise ValueError(
                f"aux_losses[{index}] has coefficient {coef!r}; give a finite number"
                " (0 leaves the loss out)"
            )
        if coef != 0:
            active.append((aux, float(coef)))
    return active


def _checked_loss(output: LossOutput, name: str) -> torch.Tensor:
    value = getattr(output, "loss", None)
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(
            f"loss {name!r} returned {shape} as its loss; a loss returns"
            " LossOutput(loss=<0-dim tensor>)"
        )
    return value
