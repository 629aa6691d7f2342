"""The objective on the Fireworks trainer's own loss kernels: one fused forward and backward
pass instead of the custom-loss path's two.

Fireworks runs ``importance_sampling``, ``ppo`` and ``cispo`` server-side on the wire contract
of :mod:`rllm_core.algorithms.native_losses`: each datum carries ``target_tokens``, the sampler's
``logprobs`` and per-token ``advantages``, and the kernel sums its per-token loss over every
token of the request. :func:`native_datums` folds the plan's aggregation into the advantages,
so that sum is the objective the loss computes client-side, with the same gradient;
:func:`replayed_metrics` evaluates that objective without gradient on the logprobs the trainer
returns, so both paths report the same metrics.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

import torch
from fireworks.training.sdk import types as fw
from fireworks.training.sdk.types.loss_fn_type import LossFnType
from rllm_core.algorithms.native_losses import NATIVE_KERNELS, aggregation_weights
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum

from rllm_trainer_backend_fireworks.losses import StepLoss

__all__ = ["available_kernels", "native_datums", "replayed_metrics"]


def available_kernels() -> frozenset[str]:
    """The kernels a loss may map to that the installed SDK also lists as a ``LossFnType``."""
    return frozenset(NATIVE_KERNELS) & frozenset(typing.get_args(LossFnType))


def native_datums(datums: Sequence[Datum], objective: Objective) -> list[fw.Datum]:
    """``datums`` for a native kernel, in the next-token layout (input ``token_ids[:-1]``,
    targets ``token_ids[1:]``): ``logprobs`` are the sampler's, ``advantages`` each action
    token's advantage times its weight in the objective's aggregation over the whole call
    (0 on prompt and observation tokens)."""
    for index, datum in enumerate(datums):
        if len(datum.token_ids) < 2:
            raise ValueError(
                f"datum {index} has {len(datum.token_ids)} token(s); a datum needs at least 2"
                " tokens to train (a prompt and a completion)"
            )
    weights = aggregation_weights(
        objective.aggregation,
        [datum.action_mask for datum in datums],
        norm_length=objective.norm_length,
    )
    out = []
    for datum, row in zip(datums, weights, strict=True):
        advantages = [float(a) * w for a, w in zip(datum.advantages, row, strict=True)]
        out.append(
            fw.Datum(
                model_input=fw.ModelInput.from_ints(list(datum.token_ids[:-1])),
                loss_fn_inputs={
                    "target_tokens": [int(t) for t in datum.token_ids[1:]],
                    "logprobs": [float(lp) for lp in datum.logprobs[1:]],
                    "advantages": advantages[1:],
                },
            )
        )
    return out


def replayed_metrics(step_loss: StepLoss, outputs: Sequence[Any]) -> dict[str, float]:
    """The metrics the custom path reports (``loss``, each term's, ``offpolicy/*``,
    ``tokens``, ``sequences``), from the objective evaluated without gradient on the target
    logprobs a native kernel returned (``outputs[i]["logprobs"]``)."""
    rows = []
    for index, output in enumerate(outputs):
        if "logprobs" not in output:
            raise RuntimeError(
                f"the trainer's output for datum {index} has no logprobs (it has"
                f" {sorted(output)}); the native loss path needs a fireworks-ai SDK whose"
                " kernels return them, or set loss_path = 'custom' in [trainer]"
            )
        rows.append(torch.tensor(output["logprobs"].tolist(), dtype=torch.float32))
    with torch.no_grad():
        _, metrics = step_loss(outputs, rows)
    return metrics
