"""Supervised fine-tuning steps on the Fireworks trainer's built-in ``cross_entropy`` loss.

The trainer's ``cross_entropy`` is ``sum(-logprob * weight)`` over every target token of the
request, with no normalization of its own (the SDK's custom-loss path sends its gradient as
exactly these weights, and ``optim_step`` is called without ``grad_accumulation_normalization``).
Weights of ``1 / trained tokens`` on the trained tokens and 0 elsewhere make that sum the
token-mean negative log-likelihood of the whole call, however the SDK splits the request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fireworks.training.sdk import types as fw
from rllm_core.types import Datum

from rllm_trainer_backend_fireworks.losses import to_sdk_datum

__all__ = [
    "SupervisedBatch",
    "build_supervised_batch",
    "scored_logprobs",
    "scoring_datums",
    "supervised_nll",
]


@dataclass(frozen=True)
class SupervisedBatch:
    """One supervised call's datums in the SDK's next-token layout, with each datum's
    trained-token mask over its target tokens (``action_mask[1:]``)."""

    sdk_datums: list[fw.Datum]
    masks: list[list[bool]]
    trained_tokens: int


def build_supervised_batch(datums: Sequence[Datum]) -> SupervisedBatch:
    """Check and convert ``datums``; raises ``ValueError`` naming the first bad datum, or
    when no datum has a trained token."""
    if not datums:
        raise ValueError(
            "forward_backward_supervised got no datums; pass the optimizer step's datums"
        )
    for index, datum in enumerate(datums):
        if len(datum.token_ids) < 2:
            raise ValueError(
                f"datum {index} has {len(datum.token_ids)} token(s); a datum needs at least 2"
                " tokens to train (a prompt token and a trained one)"
            )
        if datum.action_mask[0]:
            raise ValueError(
                f"datum {index} marks its first token as trained; the first token has no"
                " logprob to train, so a datum starts with at least one prompt token"
            )
    masks = [[bool(m) for m in datum.action_mask[1:]] for datum in datums]
    trained = sum(sum(mask) for mask in masks)
    if trained == 0:
        raise ValueError(
            f"none of the {len(datums)} datums has a trained token (action_mask is false"
            " everywhere); supervised training needs assistant tokens marked in action_mask"
        )
    weight = 1.0 / trained
    return SupervisedBatch(
        sdk_datums=[
            to_sdk_datum(datum, [weight if m else 0.0 for m in mask])
            for datum, mask in zip(datums, masks, strict=True)
        ],
        masks=masks,
        trained_tokens=trained,
    )


def supervised_nll(outputs: Sequence[Any], batch: SupervisedBatch) -> float:
    """The call's mean negative log-likelihood over its trained tokens, from the per-datum
    target logprobs (``outputs[i]["logprobs"]``) the trainer's ``cross_entropy`` returns."""
    if len(outputs) != len(batch.masks):
        raise RuntimeError(
            f"the trainer returned outputs for {len(outputs)} datums, expected {len(batch.masks)}"
        )
    terms: list[float] = []
    for index, (output, mask) in enumerate(zip(outputs, batch.masks, strict=True)):
        if "logprobs" not in output:
            raise RuntimeError(
                f"the trainer's cross_entropy output for datum {index} has no logprobs (it has"
                f" {sorted(output)}); this backend needs a fireworks-ai SDK that returns them"
            )
        values = [float(v) for v in output["logprobs"].tolist()]
        if len(values) != len(mask):
            raise RuntimeError(
                f"the trainer returned {len(values)} logprobs for datum {index}, which has"
                f" {len(mask)} target tokens"
            )
        terms.extend(-value for value, trained in zip(values, mask, strict=True) if trained)
    return math.fsum(terms) / batch.trained_tokens


def scoring_datums(datums: Sequence[Datum]) -> list[fw.Datum]:
    """``datums`` for a ``cross_entropy`` forward pass (every weight 0: nothing is trained)."""
    return [to_sdk_datum(datum, [0.0] * (len(datum.token_ids) - 1)) for datum in datums]


def scored_logprobs(outputs: Sequence[Any], datums: Sequence[Datum]) -> list[list[float]]:
    """Each datum's logprobs aligned with its tokens (0.0 at position 0), from the per-datum
    target logprobs of a ``cross_entropy`` forward pass."""
    if len(outputs) != len(datums):
        raise RuntimeError(
            f"the trainer returned outputs for {len(outputs)} datums, expected {len(datums)}"
        )
    scored = []
    for index, (output, datum) in enumerate(zip(outputs, datums, strict=True)):
        values = [float(v) for v in output["logprobs"].tolist()]
        if len(values) != len(datum.token_ids) - 1:
            raise RuntimeError(
                f"the trainer returned {len(values)} logprobs for datum {index}, which has"
                f" {len(datum.token_ids) - 1} target tokens"
            )
        scored.append([0.0, *values])
    return scored
