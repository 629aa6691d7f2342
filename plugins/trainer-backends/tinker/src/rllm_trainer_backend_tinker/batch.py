"""Translate a training call's datums into Tinker datums (and, for ``forward_backward``,
right-padded tensors).

Tinker trains next-token prediction: a Tinker datum's ``model_input`` is the sequence without
its last token and ``target_tokens`` is the sequence shifted by one, so Tinker's logprob ``j``
belongs to token ``j + 1`` of the rllm datum. Token 0 has no logprob; it is never an action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tinker
import torch
from rllm_core.types import Datum

__all__ = [
    "Batch",
    "SupervisedBatch",
    "build_batch",
    "build_supervised_batch",
    "logprobs_matrix",
    "scored_logprobs",
    "scoring_datums",
    "supervised_nll",
]


@dataclass(frozen=True)
class Batch:
    """The datums of one call as Tinker sends them and as the losses see them (``[B, T]``)."""

    tinker_datums: list[tinker.types.Datum]
    lengths: list[int]
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    observation_mask: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return max(self.lengths)


def build_batch(datums: Sequence[Datum]) -> Batch:
    """Check and convert ``datums``; raises ``ValueError`` naming the first bad datum."""
    if not datums:
        raise ValueError("forward_backward got no datums; pass the optimizer step's datums")
    for index, datum in enumerate(datums):
        _check(index, datum)
    lengths = [len(datum.token_ids) for datum in datums]
    width = max(lengths)

    def padded(field: str) -> torch.Tensor:
        out = torch.zeros(len(datums), width, dtype=torch.float32)
        for row, datum in enumerate(datums):
            values = getattr(datum, field)
            out[row, : len(values)] = torch.tensor([float(v) for v in values])
        return out

    return Batch(
        tinker_datums=[
            _tinker_datum(datum, [1.0 if m else 0.0 for m in datum.action_mask[1:]])
            for datum in datums
        ],
        lengths=lengths,
        rollout_logprobs=padded("logprobs"),
        advantages=padded("advantages"),
        action_mask=padded("action_mask"),
        observation_mask=padded("observation_mask"),
    )


def logprobs_matrix(logprobs_list: Sequence[torch.Tensor], batch: Batch) -> torch.Tensor:
    """Tinker's per-datum target logprobs as ``[B, T]`` aligned with the rllm tokens: position
    0 and padding hold 0.0, and gradients flow back to the tensors in ``logprobs_list``."""
    if len(logprobs_list) != batch.size:
        raise RuntimeError(
            f"Tinker returned logprobs for {len(logprobs_list)} datums but {batch.size} were sent"
        )
    rows = []
    for index, (values, length) in enumerate(zip(logprobs_list, batch.lengths, strict=True)):
        flat = values.reshape(-1).to(torch.float32)
        if flat.numel() != length - 1:
            raise RuntimeError(
                f"Tinker returned {flat.numel()} logprobs for datum {index}, which has"
                f" {length - 1} target tokens"
            )
        lead = torch.zeros(1, dtype=torch.float32)
        tail = torch.zeros(batch.width - length, dtype=torch.float32)
        rows.append(torch.cat([lead, flat, tail]))
    return torch.stack(rows)


@dataclass(frozen=True)
class SupervisedBatch:
    """The datums of one supervised call as Tinker's ``cross_entropy`` takes them, with each
    datum's trained-token mask over its target tokens (``action_mask[1:]``)."""

    tinker_datums: list[tinker.types.Datum]
    masks: list[list[bool]]
    trained_tokens: int


def build_supervised_batch(datums: Sequence[Datum]) -> SupervisedBatch:
    """Check and convert ``datums`` for ``cross_entropy``; raises ``ValueError`` naming the
    first bad datum, or when no datum has a trained token.

    Tinker's ``cross_entropy`` loss is ``sum(-logprob * weight)`` over every target token of
    the request, with no normalization of its own (the SDK's custom-loss path relies on that
    sum). Weights of ``1 / trained tokens`` on the trained tokens and 0 elsewhere make it the
    token-mean negative log-likelihood of the whole call, however Tinker splits the request.
    """
    if not datums:
        raise ValueError(
            "forward_backward_supervised got no datums; pass the optimizer step's datums"
        )
    for index, datum in enumerate(datums):
        _check(index, datum)
    masks = [[bool(m) for m in datum.action_mask[1:]] for datum in datums]
    trained = sum(sum(mask) for mask in masks)
    if trained == 0:
        raise ValueError(
            f"none of the {len(datums)} datums has a trained token (action_mask is false"
            " everywhere); supervised training needs assistant tokens marked in action_mask"
        )
    weight = 1.0 / trained
    return SupervisedBatch(
        tinker_datums=[
            _tinker_datum(datum, [weight if m else 0.0 for m in mask])
            for datum, mask in zip(datums, masks, strict=True)
        ],
        masks=masks,
        trained_tokens=trained,
    )


def supervised_nll(outputs: Sequence[Any], batch: SupervisedBatch) -> float:
    """The call's mean negative log-likelihood over its trained tokens, from the per-datum
    target logprobs (``outputs[i]["logprobs"]``) that Tinker's ``cross_entropy`` returns."""
    if len(outputs) != len(batch.masks):
        raise RuntimeError(
            f"Tinker returned outputs for {len(outputs)} datums but {len(batch.masks)} were sent"
        )
    terms: list[float] = []
    for index, (output, mask) in enumerate(zip(outputs, batch.masks, strict=True)):
        if "logprobs" not in output:
            raise RuntimeError(
                f"Tinker's cross_entropy output for datum {index} has no logprobs (it has"
                f" {sorted(output)}); this backend needs a tinker SDK that returns them"
            )
        values = [float(v) for v in output["logprobs"].tolist()]
        if len(values) != len(mask):
            raise RuntimeError(
                f"Tinker returned {len(values)} logprobs for datum {index}, which has"
                f" {len(mask)} target tokens"
            )
        terms.extend(-value for value, trained in zip(values, mask, strict=True) if trained)
    return math.fsum(terms) / batch.trained_tokens


def scoring_datums(datums: Sequence[Datum]) -> list[tinker.types.Datum]:
    """Check and convert ``datums`` for a forward pass (every weight 0: nothing is trained);
    raises ``ValueError`` naming the first bad datum."""
    for index, datum in enumerate(datums):
        _check(index, datum, trainable=False)
    return [_tinker_datum(datum, [0.0] * (len(datum.token_ids) - 1)) for datum in datums]


def scored_logprobs(outputs: Sequence[Any], datums: Sequence[Datum]) -> list[list[float]]:
    """Each datum's logprobs aligned with its tokens (0.0 at position 0), from the per-datum
    target logprobs of a ``cross_entropy`` forward pass."""
    if len(outputs) != len(datums):
        raise RuntimeError(
            f"Tinker returned outputs for {len(outputs)} datums but {len(datums)} were sent"
        )
    scored = []
    for index, (output, datum) in enumerate(zip(outputs, datums, strict=True)):
        values = [float(v) for v in output["logprobs"].tolist()]
        if len(values) != len(datum.token_ids) - 1:
            raise RuntimeError(
                f"Tinker returned {len(values)} logprobs for datum {index}, which has"
                f" {len(datum.token_ids) - 1} target tokens"
            )
        scored.append([0.0, *values])
    return scored


def _tinker_datum(datum: Datum, weights: list[float]) -> tinker.types.Datum:
    tokens = [int(t) for t in datum.token_ids]
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.types.TensorData(
                data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
            ),
            "weights": tinker.types.TensorData(
                data=weights,
                dtype="float32",
                shape=[len(tokens) - 1],
            ),
        },
    )


def _check(index: int, datum: Datum, *, trainable: bool = True) -> None:
    if len(datum.token_ids) < 2:
        raise ValueError(
            f"datum {index} has {len(datum.token_ids)} token(s); Tinker trains next-token"
            " logprobs, so a datum needs a prompt token and at least one more"
        )
    for position, token in enumerate(datum.token_ids):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(
                f"datum {index} has token id {token!r} at position {position}; token ids are"
                " non-negative integers"
            )
    if trainable and datum.action_mask[0]:
        raise ValueError(
            f"datum {index} marks its first token as an action; the first token has no"
            " logprob to train, so a datum starts with at least one prompt token"
        )
