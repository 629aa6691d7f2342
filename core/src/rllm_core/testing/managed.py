"""Checks of a managed trainer backend's supervised step on its service's own ``cross_entropy``
loss (:mod:`rllm_core.kit.managed.supervised`), shared by the backends' tests against a fake
service and against the real one.

- :func:`supervised_datum` builds a datum from its tokens and trained-token mask;
- :data:`BAD_SUPERVISED_DATUMS` are ``pytest.param(datums, message)`` cases that
  ``forward_backward_supervised`` refuses with a ``ValueError`` matching ``message``, before it
  sends anything;
- :func:`check_supervised_request` holds the datums a backend sent to the layout and the weights
  that make the service's sum the token-mean negative log-likelihood;
- :func:`check_one_supervised_step` takes one step on a live backend and checks what it reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from rllm_core.types import Datum

__all__ = [
    "BAD_SUPERVISED_DATUMS",
    "check_one_supervised_step",
    "check_supervised_request",
    "supervised_datum",
]


def supervised_datum(
    tokens: list[int], trained: list[bool], tool: list[bool] | None = None
) -> Datum:
    """A datum of ``tokens`` whose ``trained`` tokens are actions and ``tool`` tokens
    observations (none by default); its logprobs and advantages are 0."""
    n = len(tokens)
    return Datum(
        token_ids=tokens,
        logprobs=[0.0] * n,
        advantages=[0.0] * n,
        action_mask=trained,
        observation_mask=tool or [False] * n,
    )


BAD_SUPERVISED_DATUMS = [
    pytest.param([], "got no datums", id="none"),
    pytest.param(
        [supervised_datum([1, 2, 3], [False, False, False])],
        "none of the 1 datums has a trained token",
        id="nothing-trained",
    ),
    pytest.param(
        [supervised_datum([1, 2], [True, True])],
        "datum 0 marks its first token as an action",
        id="first-token-trained",
    ),
    pytest.param(
        [supervised_datum([1, 2, 3], [False, True, True]), supervised_datum([5], [False])],
        r"datum 1 has 1 token\(s\); a datum needs at least 2 tokens",
        id="one-token",
    ),
    pytest.param(
        [supervised_datum([1, -2], [False, True])],
        "datum 0 has token id -2 at position 1",
        id="negative-token-id",
    ),
]


def check_supervised_request(datums: Sequence[Datum], sent: Sequence[Any]) -> None:
    """``sent`` (the SDK datums of one supervised request for ``datums``) holds each datum in
    the next-token layout, weighted ``1 / trained tokens`` on its trained tokens and 0 on the
    others (prompt, user and tool tokens), so the weights of the whole request sum to 1."""
    trained = sum(sum(d.action_mask[1:]) for d in datums)
    total = 0.0
    for d, sdk_datum in zip(datums, sent, strict=True):
        assert sdk_datum.model_input.to_ints() == d.token_ids[:-1]
        assert sdk_datum.loss_fn_inputs["target_tokens"].tolist() == d.token_ids[1:]
        weights = sdk_datum.loss_fn_inputs["weights"].tolist()
        for weight, action in zip(weights, d.action_mask[1:], strict=True):
            assert weight == (pytest.approx(1 / trained) if action else 0.0)
        total += math.fsum(weights)
    assert total == pytest.approx(1.0, abs=1e-6)


def check_one_supervised_step(
    backend: Any, prompt: list[int], answer: list[int], prefix: str
) -> None:
    """One supervised step of ``backend`` (weight version 0, its service's figures prefixed
    ``prefix/``) on two copies of ``prompt`` followed by the trained ``answer``: it reports the
    trained tokens and sequences, a plausible ``nll`` that the service's own sum of the weighted
    losses (``<prefix>/loss:sum``) agrees with, and ``optim_step`` publishes version 1."""
    datum = supervised_datum(prompt + answer, [False] * len(prompt) + [True] * len(answer))
    metrics = backend.forward_backward_supervised([datum, datum])
    assert metrics["tokens"] == 2 * len(answer) and metrics["sequences"] == 2
    assert 0.0 < metrics["nll"] < 50.0
    assert metrics[f"{prefix}/loss:sum"] == pytest.approx(metrics["nll"], rel=1e-3)
    backend.optim_step()
    assert backend.weight_version == 1
