"""Run rllm-core losses on the logprobs the Fireworks trainer computes.

The Fireworks training API trains a custom loss in two passes: a forward that returns each
datum's target-token logprobs, a client-side loss whose gradient with respect to those logprobs
is sent back as per-token weights of a linear surrogate. This module converts datums to the
SDK's next-token layout and evaluates the run's objective (policy loss, auxiliary losses,
corrections) on those logprobs, so every loss rllm-core ships runs unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from fireworks.training.sdk import types as fw
from rllm_core.algorithms.objective import LossInputs, Objective
from rllm_core.types import Datum

__all__ = ["StepLoss", "to_sdk_datum"]


def to_sdk_datum(datum: Datum, weights: Sequence[float] | None = None) -> fw.Datum:
    """The SDK's next-token datum: input ``token_ids[:-1]``, targets ``token_ids[1:]``.

    ``weights`` (one per target token) default to 1 on the action tokens and 0 elsewhere; the
    custom-loss path replaces them with the loss's gradient before the backward pass.
    """
    if len(datum.token_ids) < 2:
        raise ValueError(
            f"a datum needs at least 2 tokens to train (a prompt and a completion), got"
            f" {len(datum.token_ids)}: {datum.token_ids}"
        )
    return fw.Datum(
        model_input=fw.ModelInput.from_ints(list(datum.token_ids[:-1])),
        loss_fn_inputs={
            "target_tokens": [int(t) for t in datum.token_ids[1:]],
            "weights": (
                [1.0 if a else 0.0 for a in datum.action_mask[1:]]
                if weights is None
                else [float(w) for w in weights]
            ),
        },
    )


class StepLoss:
    """The client-side loss of one ``forward_backward`` call: the run's objective.

    Called by the SDK as ``step_loss(sdk_datums, logprobs_list)`` with one 1-D logprob tensor
    per datum (its target tokens, so ``token_ids[1:]``); returns the scalar and float metrics.
    Position 0 of each sequence has no logprob (nothing predicts it) and is never an action or
    observation token, so it is padded with 0. The whole call is one micro-batch of the
    :class:`~rllm_core.algorithms.objective.Objective`.
    """

    def __init__(self, datums: Sequence[Datum], objective: Objective) -> None:
        self._datums = list(datums)
        self._objective = objective
        width = max(len(d.token_ids) for d in self._datums)
        self._lengths = [len(d.token_ids) for d in self._datums]
        self.rollout_logprobs = _padded([d.logprobs for d in self._datums], width, 0.0)
        self.advantages = _padded([d.advantages for d in self._datums], width, 0.0)
        self.action_mask = _padded([d.action_mask for d in self._datums], width, 0.0)
        self.observation_mask = _padded([d.observation_mask for d in self._datums], width, 0.0)
        self.metrics: dict[str, float] = {}

    def __call__(
        self, data: Sequence[Any], logprobs_list: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        step = self._objective.begin([self.action_mask], [self.observation_mask])
        total = step.evaluate(
            LossInputs(
                logprobs=self.stack(logprobs_list),
                rollout_logprobs=self.rollout_logprobs,
                advantages=self.advantages,
                action_mask=self.action_mask,
                observation_mask=self.observation_mask,
            )
        )
        if not math.isfinite(float(total.detach())):
            raise FloatingPointError(
                f"the objective is {float(total.detach())} on finite inputs; check the losses'"
                " config and the datums' advantages"
            )
        metrics = step.metrics()
        metrics["tokens"] = float(sum(self._lengths))
        metrics["sequences"] = float(len(self._lengths))
        self.metrics = metrics
        return total, metrics

    def stack(self, logprobs_list: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[B, T]`` logprobs aligned with ``token_ids`` from the trainer's per-datum
        target-token logprobs, keeping their gradient."""
        if len(logprobs_list) != len(self._datums):
            raise ValueError(
                f"the trainer returned logprobs for {len(logprobs_list)} datums, expected"
                f" {len(self._datums)}"
            )
        width = self.action_mask.shape[1]
        rows = []
        for index, (row, length) in enumerate(zip(logprobs_list, self._lengths, strict=True)):
            flat = row.reshape(-1).to(torch.float32)
            if flat.shape[0] != length - 1:
                raise ValueError(
                    f"the trainer returned {flat.shape[0]} logprobs for datum {index} of"
                    f" {length} tokens, expected {length - 1}"
                )
            rows.append(torch.nn.functional.pad(flat, (1, width - length)))
        return torch.stack(rows)


def _padded(rows: Sequence[Sequence[float | bool]], width: int, fill: float) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=torch.float32)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.tensor([float(v) for v in row], dtype=torch.float32)
    return out
