"""Supervised steps and logprob scoring on a managed training service's own ``cross_entropy``
loss, for any SDK whose datums take the next-token layout (input ``token_ids[:-1]``, targets
``token_ids[1:]`` with one weight each).

The service's ``cross_entropy`` is ``sum(-logprob * weight)`` over every target token of the
request, with no normalization of its own (the SDKs' custom-loss path relies on that sum).
Weights of ``1 / trained tokens`` on the trained tokens (``action_mask[1:]``) and 0 elsewhere
make it the token-mean negative log-likelihood of the whole call, however the service splits
the request. A forward pass of the same loss with every weight 0 trains nothing and returns each
datum's target logprobs.

A backend passes ``to_sdk(datum, weights)``, its SDK's datum in that layout, and its training
client; the service name in messages is that of its :class:`~rllm_core.kit.managed.ServiceCalls`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rllm_core.kit.managed.calls import ServiceCalls, service_metrics
from rllm_core.types import Datum

__all__ = [
    "SupervisedBatch",
    "build_supervised_batch",
    "check_datum",
    "compute_logprobs",
    "forward_backward_supervised",
    "scored_logprobs",
    "supervised_nll",
]

SdkDatum = TypeVar("SdkDatum")


def check_datum(index: int, datum: Datum, *, trainable: bool = True) -> None:
    """Raise ``ValueError`` naming datum ``index`` when it cannot be sent: fewer than 2 tokens,
    a token id that is not a non-negative integer, or (``trainable``) a first token marked as
    an action, which has no logprob to train."""
    if len(datum.token_ids) < 2:
        raise ValueError(
            f"datum {index} has {len(datum.token_ids)} token(s); a datum needs at least 2"
            " tokens to train next-token logprobs (a prompt token and at least one more)"
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


@dataclass(frozen=True)
class SupervisedBatch(Generic[SdkDatum]):
    """One supervised call's datums as the SDK takes them, with each datum's trained-token
    mask over its target tokens (``action_mask[1:]``)."""

    sdk_datums: list[SdkDatum]
    masks: list[list[bool]]
    trained_tokens: int


def build_supervised_batch(
    datums: Sequence[Datum], to_sdk: Callable[[Datum, list[float]], SdkDatum]
) -> SupervisedBatch[SdkDatum]:
    """Check and convert ``datums`` with the token-mean weights; raises ``ValueError`` naming
    the first bad datum, or when no datum has a trained token."""
    if not datums:
        raise ValueError(
            "forward_backward_supervised got no datums; pass the optimizer step's datums"
        )
    for index, datum in enumerate(datums):
        check_datum(index, datum)
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
            to_sdk(datum, [weight if m else 0.0 for m in mask])
            for datum, mask in zip(datums, masks, strict=True)
        ],
        masks=masks,
        trained_tokens=trained,
    )


def supervised_nll(outputs: Sequence[Any], batch: SupervisedBatch[Any], service: str) -> float:
    """The call's mean negative log-likelihood over its trained tokens, from the per-datum
    target logprobs (``outputs[i]["logprobs"]``) that ``service``'s ``cross_entropy``
    returned."""
    rows = _target_logprobs(outputs, [len(mask) for mask in batch.masks], service)
    terms = [
        -value
        for values, mask in zip(rows, batch.masks, strict=True)
        for value, trained in zip(values, mask, strict=True)
        if trained
    ]
    return math.fsum(terms) / batch.trained_tokens


def scored_logprobs(
    outputs: Sequence[Any], datums: Sequence[Datum], service: str
) -> list[list[float]]:
    """Each datum's logprobs aligned with its tokens (0.0 at position 0), from the per-datum
    target logprobs of ``service``'s ``cross_entropy`` forward pass."""
    rows = _target_logprobs(outputs, [len(datum.token_ids) - 1 for datum in datums], service)
    return [[0.0, *values] for values in rows]


def forward_backward_supervised(
    calls: ServiceCalls,
    training: Any,
    datums: Sequence[Datum],
    to_sdk: Callable[[Datum, list[float]], Any],
    prefix: str,
) -> dict[str, float]:
    """Add the gradient of the mean negative log-likelihood of ``datums``' trained tokens on
    ``training``'s ``cross_entropy`` loss (one ``forward_backward`` request, sent through
    ``calls``). Invalid datums raise ``ValueError`` before anything is sent.

    Returns ``nll`` (the mean, from the logprobs the service returns), ``tokens`` (trained
    tokens), ``sequences``, the service's numeric figures as ``<prefix>/<name>`` and the
    request's retries as ``<prefix>/retries``."""
    batch = build_supervised_batch(datums, to_sdk)
    retries: list[int] = []
    output = calls.call(
        lambda: training.forward_backward(batch.sdk_datums, "cross_entropy"),
        "forward_backward_supervised",
        retries,
    )
    return {
        "nll": supervised_nll(output.loss_fn_outputs, batch, calls.service),
        "tokens": float(batch.trained_tokens),
        "sequences": float(len(batch.masks)),
        **service_metrics(output.metrics, prefix),
        f"{prefix}/retries": float(len(retries)),
    }


def compute_logprobs(
    calls: ServiceCalls,
    training: Any,
    datums: Sequence[Datum],
    to_sdk: Callable[[Datum, list[float]], Any],
) -> list[list[float]]:
    """Each datum's per-token logprobs under ``training``'s current weights (0.0 at position
    0), from a ``cross_entropy`` forward pass with every weight 0: no gradient, nothing of the
    training run changes. Raises ``ValueError`` naming the first datum that cannot be sent."""
    if not datums:
        return []
    for index, datum in enumerate(datums):
        check_datum(index, datum, trainable=False)
    sent = [to_sdk(datum, [0.0] * (len(datum.token_ids) - 1)) for datum in datums]
    output = calls.call(
        lambda: training.forward(sent, "cross_entropy"), "computing logprobs", idempotent=True
    )
    return scored_logprobs(output.loss_fn_outputs, datums, calls.service)


def _target_logprobs(
    outputs: Sequence[Any], lengths: Sequence[int], service: str
) -> list[list[float]]:
    """Each output's ``logprobs`` as floats, checked against its datum's number of target
    tokens (``lengths``)."""
    if len(outputs) != len(lengths):
        raise RuntimeError(
            f"{service} returned outputs for {len(outputs)} datums but {len(lengths)} were sent"
        )
    rows = []
    for index, (output, length) in enumerate(zip(outputs, lengths, strict=True)):
        if "logprobs" not in output:
            raise RuntimeError(
                f"{service}'s cross_entropy output for datum {index} has no logprobs (it has"
                f" {sorted(output)}); this backend needs a {service} SDK that returns them"
            )
        values = [float(v) for v in output["logprobs"].tolist()]
        if len(values) != length:
            raise RuntimeError(
                f"{service} returned {len(values)} logprobs for datum {index}, which has"
                f" {length} target tokens"
            )
        rows.append(values)
    return rows
