"""One supervised update on any trainer backend, and the NLL of held-out datums.

A backend that offers :class:`~rllm_core.ports.SupervisedTrainer` is called with
``forward_backward_supervised(datums)``; any other is trained through
``forward_backward(datums, nll_objective())`` (:mod:`rllm_core.algorithms.nll`). Both give
``nll`` (the mean over the call's trained tokens), ``tokens`` (trained tokens) and
``sequences``; a backend's own metrics (``<backend>/...``) are kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rllm_core.algorithms.nll import nll_objective
from rllm_core.ports import LogprobScorer, SupervisedTrainer
from rllm_core.types import Datum

__all__ = ["eval_nll", "supervised_forward_backward"]

_OBJECTIVE = nll_objective()
# The objective's off-policy diagnostics compare with the sampler's logprobs, which SFT datums
# do not have; its own counts are renamed to the supervised ones.
_DROPPED = ("offpolicy/", "correction/", "nll/")
_OBJECTIVE_KEYS = ("loss", "action_tokens", "observation_tokens", "tokens", "sequences")


def supervised_forward_backward(trainer: Any, datums: Sequence[Datum]) -> dict[str, float]:
    """Add the gradient of the mean NLL of ``datums``' trained tokens; see the module
    docstring."""
    if isinstance(trainer, SupervisedTrainer):
        return {k: float(v) for k, v in trainer.forward_backward_supervised(list(datums)).items()}
    metrics = trainer.forward_backward(list(datums), _OBJECTIVE)
    out = {
        "nll": float(metrics["loss"]),
        "tokens": float(metrics["action_tokens"]),
        "sequences": float(sum(len(d.metadata.get("packed_lengths", [0])) for d in datums)),
    }
    for name, value in metrics.items():
        if name not in _OBJECTIVE_KEYS and not name.startswith(_DROPPED):
            out[name] = float(value)
    return out


def eval_nll(trainer: Any, datums: Sequence[Datum], *, chunk: int = 32) -> Mapping[str, float]:
    """``nll`` (mean over the trained tokens of ``datums``), ``ppl`` and ``tokens``, from the
    backend's logprobs without gradient (:class:`~rllm_core.ports.LogprobScorer`)."""
    if not isinstance(trainer, LogprobScorer):
        raise TypeError("the trainer backend computes no logprobs (no LogprobScorer)")
    total, tokens = 0.0, 0
    for start in range(0, len(datums), chunk):
        part = list(datums[start : start + chunk])
        for datum, values in zip(part, trainer.compute_logprobs(part), strict=True):
            for value, trained in zip(values, datum.action_mask, strict=True):
                if trained:
                    total -= float(value)
                    tokens += 1
    nll = total / tokens if tokens else 0.0
    return {"nll": nll, "ppl": math.exp(min(nll, 700.0)), "tokens": float(tokens)}
