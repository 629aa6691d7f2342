"""Run rllm-core losses on the logprobs the Fireworks trainer computes.

The Fireworks training API trains a custom loss in two passes: a forward that returns each
datum's target-token logprobs, a client-side loss whose gradient with respect to those logprobs
is sent back as per-token weights of a linear surrogate. This module converts datums to the
SDK's next-token layout and builds the client-side loss from a policy loss and its auxiliary
losses, so every loss rllm-core ships runs unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from fireworks.training.sdk import types as fw
from rllm_core.algorithms.aggregation import (
    MaskAwareAggregate,
    make_aggregate,
    step_normalizers,
)
from rllm_core.algorithms.naming import loss_name, unique_names
from rllm_core.ports import Loss, LossContext
from rllm_core.types import Datum

__all__ = ["StepLoss", "named_losses", "to_sdk_datum"]


def to_sdk_datum(datum: Datum) -> fw.Datum:
    """The SDK's next-token datum: input ``token_ids[:-1]``, targets ``token_ids[1:]``.

    The weights mark the action tokens; the custom-loss path replaces them with the loss's
    gradient before the backward pass.
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
            "weights": [1.0 if a else 0.0 for a in datum.action_mask[1:]],
        },
    )


class StepLoss:
    """The client-side loss of one ``forward_backward`` call: ``loss + sum(coef * aux)``.

    Called by the SDK as ``step_loss(sdk_datums, logprobs_list)`` with one 1-D logprob tensor
    per datum (its target tokens, so ``token_ids[1:]``); returns the scalar and float metrics.
    Position 0 of each sequence has no logprob (nothing predicts it) and is never an action or
    observation token, so it is padded with 0. Normalizers count every datum of the call.
    """

    def __init__(
        self,
        datums: Sequence[Datum],
        losses: Sequence[tuple[Loss, float, str]],
        *,
        aggregation: str,
        norm_length: float | None,
    ) -> None:
        self._datums = list(datums)
        self._losses = list(losses)
        width = max(len(d.token_ids) for d in self._datums)
        self._lengths = [len(d.token_ids) for d in self._datums]
        self.rollout_logprobs = _padded([d.logprobs for d in self._datums], width, 0.0)
        self.advantages = _padded([d.advantages for d in self._datums], width, 0.0)
        self.action_mask = _padded([d.action_mask for d in self._datums], width, 0.0)
        self.observation_mask = _padded([d.observation_mask for d in self._datums], width, 0.0)
        action_tokens, action_sequences = step_normalizers([self.action_mask])
        observation_tokens, observation_sequences = step_normalizers([self.observation_mask])
        self._aggregate = MaskAwareAggregate(
            action=make_aggregate(
                aggregation,
                total_tokens=action_tokens,
                total_sequences=action_sequences,
                norm_length=norm_length,
            ),
            observation=make_aggregate(
                aggregation,
                total_tokens=observation_tokens,
                total_sequences=observation_sequences,
                norm_length=norm_length,
            ),
            action_mask=self.action_mask,
            observation_mask=self.observation_mask,
        )
        self.metrics: dict[str, float] = {}

    def __call__(
        self, data: Sequence[Any], logprobs_list: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs = self.stack(logprobs_list)
        context = LossContext(
            logprobs=logprobs,
            old_logprobs=logprobs.detach(),
            rollout_logprobs=self.rollout_logprobs,
            advantages=self.advantages,
            action_mask=self.action_mask,
            observation_mask=self.observation_mask,
            aggregate=self._aggregate,
        )
        total = torch.zeros((), dtype=torch.float32)
        metrics: dict[str, float] = {}
        for loss, coef, name in self._losses:
            output = loss(context)
            value = output.loss
            if not isinstance(value, torch.Tensor) or value.dim() != 0:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise TypeError(
                    f"loss {name!r} returned {shape} as its loss; a loss returns a 0-dim tensor"
                )
            if not math.isfinite(float(value.detach())):
                raise FloatingPointError(
                    f"loss {name!r} is {float(value.detach())} on finite inputs; check its"
                    " config and the datums' advantages"
                )
            total = total + coef * value
            metrics[f"{name}/loss"] = float(value.detach())
            for key, metric in output.metrics.items():
                metrics[f"{name}/{key}"] = float(metric)
        metrics["loss"] = float(total.detach())
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


def named_losses(
    loss: Loss, aux_losses: Sequence[tuple[Loss, float]]
) -> list[tuple[Loss, float, str]]:
    """The policy loss with coefficient 1 and each auxiliary loss with a nonzero coefficient,
    each with a distinct metric name (``echo``, ``echo-2``)."""
    active = [(loss, 1.0)] + [(aux, float(coef)) for aux, coef in aux_losses if coef != 0.0]
    names = unique_names(loss_name(component) for component, _ in active)
    return [(component, coef, name) for (component, coef), name in zip(active, names, strict=True)]
