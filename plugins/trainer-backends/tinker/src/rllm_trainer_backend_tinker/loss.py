"""Evaluate the run's objective on the logprobs Tinker's forward pass returns.

Tinker's ``forward_backward_custom`` sends the datums through a forward pass, hands the
per-datum target logprobs to a client-side function as leaf tensors, and back-propagates that
function's gradient with respect to the logprobs through the model. :class:`CustomLoss` is
that function: it evaluates the :class:`~rllm_core.algorithms.objective.Objective` over the
whole call as one micro-batch and keeps its metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from rllm_core.algorithms.objective import LossInputs, Objective

from rllm_trainer_backend_tinker.batch import Batch, logprobs_matrix

__all__ = ["CustomLoss"]


class CustomLoss:
    """The ``loss_fn`` given to ``TrainingClient.forward_backward_custom`` for one call.

    After Tinker calls it, :attr:`metrics` holds the objective's metrics plus ``tokens`` and
    ``sequences``.
    """

    def __init__(self, batch: Batch, objective: Objective) -> None:
        self.batch = batch
        self.objective = objective
        self.metrics: dict[str, float] = {}

    def __call__(
        self, data: Sequence[Any], logprobs_list: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = self.batch
        step = self.objective.begin([batch.action_mask], [batch.observation_mask])
        total = step.evaluate(
            LossInputs(
                logprobs=logprobs_matrix(logprobs_list, batch),
                rollout_logprobs=batch.rollout_logprobs,
                advantages=batch.advantages,
                action_mask=batch.action_mask,
                observation_mask=batch.observation_mask,
            )
        )
        metrics = step.metrics()
        metrics["tokens"] = float(sum(batch.lengths))
        metrics["sequences"] = float(batch.size)
        self.metrics = metrics
        return total, dict(metrics)
