"""The native path: a call's datums as inputs of one of Tinker's own loss kernels, and the
objective's metrics from what the kernel returns.

Tinker's ``forward_backward(data, loss_fn, loss_fn_config)`` runs ``importance_sampling``,
``ppo`` or ``cispo`` server-side in one pass (formulas in
:mod:`rllm_core.algorithms.native_losses`). Each datum carries ``target_tokens`` (the sequence
shifted by one, as on the custom path),
``logprobs`` (the sampler's, of those targets) and ``advantages``: an action token's advantage
times the weight the plan's aggregation gives it over the whole call, 0 on every other token.
The kernel's sum over all tokens is then the plan's aggregated objective, with its gradient.

The kernel returns each datum's current target logprobs; evaluating the objective on them
without gradient gives the same metrics as the custom path (``loss``, the loss's own
``clip_fraction`` and the like, ``offpolicy/*``).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

import tinker
import torch
from rllm_core.algorithms.native_losses import NATIVE_KERNELS, aggregation_weights
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum

from rllm_trainer_backend_tinker.batch import Batch
from rllm_trainer_backend_tinker.loss import CustomLoss

__all__ = ["native_datums", "native_metrics", "sdk_kernels"]


def sdk_kernels() -> tuple[str, ...]:
    """The kernels of :data:`~rllm_core.algorithms.native_losses.NATIVE_KERNELS` that the installed
    Tinker SDK lists in ``tinker.types.LossFnType``."""
    listed = set(typing.get_args(tinker.types.LossFnType))
    return tuple(kernel for kernel in NATIVE_KERNELS if kernel in listed)


def native_datums(datums: Sequence[Datum], objective: Objective) -> list[tinker.types.Datum]:
    """``datums`` (already checked, see :func:`~rllm_trainer_backend_tinker.batch.build_batch`)
    as inputs of a Tinker loss kernel, with ``objective``'s aggregation folded into the
    advantages."""
    weights = aggregation_weights(
        objective.aggregation,
        [datum.action_mask for datum in datums],
        norm_length=objective.norm_length,
    )
    return [_kernel_datum(datum, row) for datum, row in zip(datums, weights, strict=True)]


def native_metrics(batch: Batch, objective: Objective, outputs: Sequence[Any]) -> dict[str, float]:
    """The custom path's metrics for ``batch`` (the same datums as sent), from the per-datum
    target logprobs (``outputs[i]["logprobs"]``) the kernel returned: the objective evaluated
    on them without gradient, plus ``tokens`` and ``sequences``."""
    logprobs = []
    for index, output in enumerate(outputs):
        if "logprobs" not in output:
            raise RuntimeError(
                f"Tinker's kernel output for datum {index} has no logprobs (it has"
                f" {sorted(output)}); the native path needs a tinker SDK that returns them, or"
                " set [trainer].loss_path = 'custom'"
            )
        logprobs.append(output["logprobs"].to_torch())
    loss = CustomLoss(batch, objective)
    with torch.no_grad():
        loss(batch.tinker_datums, logprobs)
    return loss.metrics


def _kernel_datum(datum: Datum, weights: list[float]) -> tinker.types.Datum:
    tokens = [int(t) for t in datum.token_ids]
    targets = len(tokens) - 1
    advantages = [
        float(advantage) * weight if action else 0.0
        for advantage, weight, action in zip(
            datum.advantages[1:], weights[1:], datum.action_mask[1:], strict=True
        )
    ]
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.types.TensorData(
                data=tokens[1:], dtype="int64", shape=[targets]
            ),
            "logprobs": tinker.types.TensorData(
                data=[float(v) for v in datum.logprobs[1:]], dtype="float32", shape=[targets]
            ),
            "advantages": tinker.types.TensorData(
                data=advantages, dtype="float32", shape=[targets]
            ),
        },
    )
