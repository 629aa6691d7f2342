"""The KL to a reference model and the entropy bonus, the two regularizers of the objective.

Per action token, with ``log r = logprob - ref_logprob`` (policy over reference), the
estimators of KL(policy || reference) (:data:`~rllm_core.plan.schema.KL_ESTIMATORS`, verl's
``kl_penalty`` modes ``kl``, ``mse`` and ``low_var_kl``) are:

- ``k1``: ``log r``;
- ``k2``: ``(log r) ** 2 / 2``;
- ``k3``: ``exp(-log r) - 1 + log r`` (Schulman's unbiased, never negative estimator);
- ``low-var-kl``: ``k3`` with ``log r`` clamped to ``[-20, 20]`` first and the result to
  ``[-10, 10]``.

The KL enters a run in one of two places (``[algorithm.kl].in``):

- ``loss``: the objective adds ``coef * aggregate(kl_t over action tokens)``, whose gradient
  flows through the current logprobs (the reference is fixed);
- ``reward``: before the step's first update, each action token's advantage becomes
  ``advantage_t - coef * kl_t`` (:func:`penalize_advantages`), with ``kl_t`` computed without
  gradient from the logprobs the batch was sampled with: the trainer's recomputed ones
  (``proximal_logprobs``) when the datum carries them, else the sampler's.

The entropy bonus adds ``-entropy_coef * aggregate(H_t over action tokens)``, ``H_t`` the
entropy of the policy's next-token distribution at the position that predicted action token
``t`` (at the trainer's logprob temperature).

Both terms reduce through the plan's aggregation with the step's normalizers (so they do not
depend on how a call is split into micro-batches) and without the rollout-correction weights,
which belong to the policy-gradient estimate (verl reduces them the same way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from rllm_core.types import Datum

if TYPE_CHECKING:
    import torch

__all__ = [
    "KL_MODES",
    "LOW_VAR_KL_BOUND",
    "LOW_VAR_LOG_RATIO_BOUND",
    "ReferenceKL",
    "entropy_from_logits",
    "kl_estimate",
    "kl_values",
    "penalize_advantages",
]

ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "low-var-kl")
KL_MODES: tuple[str, ...] = ("loss", "reward")
LOW_VAR_LOG_RATIO_BOUND = 20.0
LOW_VAR_KL_BOUND = 10.0


@dataclass(frozen=True, slots=True)
class ReferenceKL:
    """The KL to the reference model as the plan's ``[algorithm.kl]`` sets it: ``coef`` (0:
    off), ``estimator`` (one of ``k1``, ``k2``, ``k3``, ``low-var-kl``) and ``apply_in``
    (``loss`` or ``reward``); see the module docstring."""

    coef: float = 0.0
    estimator: str = "low-var-kl"
    apply_in: str = "loss"

    def __post_init__(self) -> None:
        if (
            isinstance(self.coef, bool)
            or not isinstance(self.coef, int | float)
            or not math.isfinite(self.coef)
            or self.coef < 0
        ):
            raise ValueError(
                f"the KL coefficient must be a finite number >= 0 (0: off), got {self.coef!r}"
            )
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"unknown KL estimator {self.estimator!r}; valid: {', '.join(ESTIMATORS)}"
            )
        if self.apply_in not in KL_MODES:
            raise ValueError(
                f"unknown KL placement in = {self.apply_in!r}; valid: {', '.join(KL_MODES)}"
            )

    @property
    def active(self) -> bool:
        return self.coef > 0

    @property
    def in_loss(self) -> bool:
        return self.active and self.apply_in == "loss"

    @property
    def in_reward(self) -> bool:
        return self.active and self.apply_in == "reward"


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """The per-token estimate of KL(policy || reference) of the module docstring, elementwise;
    differentiable in both arguments."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return (-log_ratio).exp() - 1.0 + log_ratio
    if estimator == "low-var-kl":
        bounded = log_ratio.clamp(-LOW_VAR_LOG_RATIO_BOUND, LOW_VAR_LOG_RATIO_BOUND)
        return ((-bounded).exp() - 1.0 + bounded).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` logits give the ``[...]`` entropies ``-sum p log p`` of their softmax, in
    float32 or wider, differentiable."""
    import torch

    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def kl_values(
    logprobs: Sequence[float], ref_logprobs: Sequence[float], estimator: str
) -> list[float]:
    """:func:`kl_estimate` over plain lists (no gradient), in float64."""
    import torch

    return kl_estimate(
        torch.tensor(list(logprobs), dtype=torch.float64),
        torch.tensor(list(ref_logprobs), dtype=torch.float64),
        estimator,
    ).tolist()


def penalize_advantages(
    datums: Sequence[Datum], ref_logprobs: Sequence[Sequence[float]], kl: ReferenceKL
) -> tuple[list[Datum], dict[str, float]]:
    """The datums with each action token's advantage lowered by ``kl.coef * kl_t`` (``in =
    "reward"``, see the module docstring), and the metrics ``kl/ref_mean`` and ``kl/ref_max``
    of ``kl_t`` over every action token. ``ref_logprobs`` holds one list per datum, as long as
    its tokens."""
    out: list[Datum] = []
    total, count, largest = 0.0, 0, -math.inf
    for index, (datum, ref) in enumerate(zip(datums, ref_logprobs, strict=True)):
        if len(ref) != len(datum.token_ids):
            raise ValueError(
                f"datum {index} has {len(datum.token_ids)} tokens but {len(ref)} reference"
                " logprobs; the reference scorer must return one per token"
            )
        policy = datum.proximal_logprobs if datum.proximal_logprobs is not None else datum.logprobs
        values = kl_values(policy, ref, kl.estimator)
        advantages = list(datum.advantages)
        for t, acted in enumerate(datum.action_mask):
            if acted:
                advantages[t] -= kl.coef * values[t]
                total += values[t]
                count += 1
                largest = max(largest, values[t])
        out.append(msgspec.structs.replace(datum, advantages=advantages))
    metrics = {"kl/ref_mean": total / count, "kl/ref_max": largest} if count else {}
    return out, metrics
