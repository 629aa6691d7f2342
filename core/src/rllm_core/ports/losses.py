"""Contracts for policy losses, auxiliary losses and advantage estimators."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from rllm_core.types import Datum

__all__ = [
    "AdvantageEstimator",
    "AdvantageResult",
    "Aggregate",
    "Loss",
    "LossContext",
    "LossOutput",
    "NATIVE_KERNELS",
    "NativeLoss",
    "SEQ_REDUCTIONS",
    "TokenAdvantages",
    "seq_reduce",
]

Aggregate = Callable[..., "torch.Tensor"]
"""``aggregate(values, mask, *, mode=None) -> scalar``: reduces per-token values ``[B, T]``
over ``mask`` with the plan's aggregation mode (``token-mean``, ``seq-mean-token-mean``,
``seq-mean-token-sum``, ``seq-mean-token-sum-norm``), or with the mode a call names
(``mode="seq-mean-token-sum"``; the norm mode needs the plan's ``norm_length``). The trainer
supplies it with normalizers computed over the whole optimizer step, so a loss that reduces
through it, in any mode, is invariant to how the step is split into micro-batches. The
normalizers are those of the mask passed: called with the context's ``observation_mask`` (or
any mask selecting exactly the same tokens) it counts observation tokens and sequences; called
with any other mask (``action_mask``, or a mask derived from it) it counts action tokens and
sequences.

A per-sequence quantity (from :meth:`LossContext.seq_reduce`) enters the loss broadcast back
to its row's tokens and reduced with ``mode="seq-mean-token-mean"``: that is the mean of the
quantity over the step's sequences."""

SEQ_REDUCTIONS: tuple[str, ...] = ("sum", "mean")
"""What :func:`seq_reduce` computes per sequence: the masked sum, or the masked mean."""


def seq_reduce(values: torch.Tensor, mask: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` over ``mask`` ``[B, T]`` to one value per sequence
    ``[B]``: the sum of the selected values (``how = "sum"``) or their mean (``"mean"``). A row
    without a selected token gives 0. As with the aggregate, values at unselected positions
    never reach the result and receive exactly zero gradient."""
    if how not in SEQ_REDUCTIONS:
        raise ValueError(
            f"seq_reduce(how={how!r}) is not a reduction; valid: {', '.join(SEQ_REDUCTIONS)}"
        )
    if values.dim() != 2 or values.shape != mask.shape:
        raise ValueError(
            f"seq_reduce expects values and mask of the same [B, T] shape, got values"
            f" {tuple(values.shape)} and mask {tuple(mask.shape)}"
        )
    selected = mask != 0
    sums = values.where(selected, 0.0).sum(dim=-1)
    if how == "sum":
        return sums
    return sums / selected.sum(dim=-1).clamp(min=1).to(values.dtype)


@dataclass(frozen=True, slots=True)
class LossContext:
    """Everything a loss sees for one micro-batch. Tensors are ``[B, T]``, right-padded, aligned
    so that position ``t`` describes token ``t`` of each sequence.

    - ``logprobs``: per-token logprobs under the current policy. The only input with a
      gradient.
    - ``old_logprobs``: logprobs under the policy at the start of this optimizer step (the
      proximal policy); equal to ``rollout_logprobs`` when training is fully on-policy.
    - ``rollout_logprobs``: the sampler's logprobs, recorded when the tokens were generated.
    - ``advantages``: per-token advantages.
    - ``action_mask``: 1.0 on tokens the policy sampled, 0.0 elsewhere (prompt, observations,
      padding).
    - ``observation_mask``: 1.0 on environment tokens after the first prompt (tool and
      terminal output the policy conditions on), 0.0 elsewhere.
    - ``aggregate``: see :data:`Aggregate`.

    :meth:`seq_reduce` gives per-sequence sums or means (a sequence-level ratio, a sequence's
    KL); a loss whose formula needs one aggregation mode pins it (see :data:`Aggregate`'s
    ``mode`` and the loss config's optional ``pinned_aggregation()``, documented in
    ``docs/plugins/losses.md``).
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    observation_mask: torch.Tensor
    aggregate: Aggregate

    def seq_reduce(
        self, values: torch.Tensor, mask: torch.Tensor | None = None, how: str = "mean"
    ) -> torch.Tensor:
        """:func:`seq_reduce` over ``mask`` (the action mask when omitted): one value per
        sequence, ``[B]``."""
        return seq_reduce(values, self.action_mask if mask is None else mask, how)


@dataclass(frozen=True, slots=True)
class LossOutput:
    """A scalar loss to minimise and named float metrics (clip fractions, ratio stats...).

    Metric names are short and unprefixed; the trainer prefixes them with the loss name.
    """

    loss: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Loss(Protocol):
    """A policy loss or an auxiliary loss.

    Contract:

    - ``__call__`` returns a finite scalar whenever its inputs are finite, including extreme
      ratios (``logprobs - old_logprobs`` of +-50).
    - Tokens outside the mask it trains on receive exactly zero gradient: reduce through
      ``ctx.aggregate`` or multiply by the mask before any reduction.
    - It does not mutate the context, and holds no state between calls other than its config.
    - Auxiliary losses are scaled by their plan coefficient outside the loss; a coefficient of
      0 must reproduce the base loss exactly.
    - Optional attribute ``reads_observations``: ``False`` promises that the loss's value and
      gradient depend on ``ctx.logprobs`` at action-mask positions only. When no term of the
      objective reads observations, a trainer may leave the logprobs elsewhere at 0 and skip
      the output layer there (most of a multi-turn episode's tokens). Absent means ``True``.

    Example::

        class Reinforce:
            def __init__(self, config): self.config = config
            def __call__(self, ctx):
                per_token = -ctx.advantages * ctx.logprobs
                return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask))
    """

    def __call__(self, ctx: LossContext) -> LossOutput: ...


@dataclass(frozen=True, slots=True)
class AdvantageResult:
    """Per-trajectory advantages, shaped like the input rewards, plus what the estimator saw.

    ``zero_variance_groups`` counts groups whose rewards were all equal (they carry no signal
    for group-relative estimators); ``metrics`` holds named statistics.
    """

    advantages: list[list[float]]
    zero_variance_groups: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class AdvantageEstimator(Protocol):
    """Turns rewards of grouped rollouts into advantages.

    ``rewards[g][i]`` is the reward of rollout ``i`` of group ``g`` (one group per task and
    prompt). The result has exactly the same shape; every value is finite, including for groups
    of size 1 and groups whose rewards are all equal. Estimators are pure: the same input gives
    the same output.

    An estimator whose advantages may ignore the rewards (a distillation estimator with no
    reward weight) says so with a ``reads_rewards`` property on its config, false in that case;
    ``plan check`` then refuses reward shaping (soft overlong, ``length_penalty``) that would
    reach nothing. A config without the property reads the rewards.

    Example::

        class MeanBaseline:
            def __init__(self, config): ...
            def compute(self, rewards):
                out = [[r - sum(g) / len(g) for r in g] for g in rewards]
                return AdvantageResult(advantages=out)
    """

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult: ...


@runtime_checkable
class TokenAdvantages(Protocol):
    """What an advantage estimator may also offer: per-token advantages from a teacher model's
    logprobs of the tokens the policy sampled (on-policy distillation).

    Contract:

    - The estimator's spec has the trait ``teacher`` (true), and its config the key
      ``teacher``: a table with ``name``, a trainer backend that scores tokens
      (:class:`~rllm_core.ports.LogprobScorer`), and that backend's keys. The plan resolves it
      as the component ``[algorithm].advantage.teacher`` and the run builds it.
    - The run first merges datums with the reward advantages of ``compute`` (one per episode,
      on each of its action tokens), then asks the teacher for ``teacher_logprobs =
      teacher.compute_logprobs(datums)``, then calls ``token_advantages(datums,
      teacher_logprobs)`` and trains on what it returns instead of ``datum.advantages``.
    - ``teacher_logprobs[d][t]`` is the teacher's logprob of token ``t`` of datum ``d`` given
      the tokens before it; ``datums[d].logprobs[t]`` is the sampler's (the student's) on
      action tokens.
    - The result has one list per datum, as long as its ``token_ids``; every value is finite
      and exactly 0.0 wherever ``action_mask`` is false (prompts, observations: only sampled
      tokens carry the teacher's signal). The same input gives the same output.

    Example (``coef`` times the negative reverse-KL estimate, on action tokens)::

        def token_advantages(self, datums, teacher_logprobs):
            return [
                [self.coef * (t - s) if a else 0.0
                 for t, s, a in zip(teacher, d.logprobs, d.action_mask)]
                for d, teacher in zip(datums, teacher_logprobs)
            ]
    """

    def token_advantages(
        self, datums: Sequence[Datum], teacher_logprobs: Sequence[Sequence[float]]
    ) -> list[list[float]]: ...


NATIVE_KERNELS: tuple[str, ...] = ("importance_sampling", "ppo", "cispo")
"""The server-side loss kernels of the managed training services (Tinker, Fireworks) a loss
may name, as their SDKs spell them (formulas in :mod:`rllm_core.algorithms.native_losses`)."""


@dataclass(frozen=True, slots=True)
class NativeLoss:
    """A loss as a managed service's server-side kernel: what a loss config's optional
    ``native_loss()`` method returns when the loss has one (a ``str`` saying why not when it
    has none; see :mod:`rllm_core.algorithms.native_losses`). ``kernel`` is one of
    :data:`NATIVE_KERNELS`; the clipped kernels also take the bounds of the ratio
    (``ratio_low`` <= 1 <= ``ratio_high``; ``ratio_low`` may be 0 for no lower bound)."""

    kernel: str
    ratio_low: float | None = None
    ratio_high: float | None = None

    def __post_init__(self) -> None:
        if self.kernel not in NATIVE_KERNELS:
            raise ValueError(
                f"unknown native kernel {self.kernel!r}; known: {', '.join(NATIVE_KERNELS)}"
            )
        clipped = self.kernel != "importance_sampling"
        if clipped and (self.ratio_low is None or self.ratio_high is None):
            raise ValueError(f"the {self.kernel!r} kernel needs ratio_low and ratio_high")
        if not clipped and (self.ratio_low is not None or self.ratio_high is not None):
            raise ValueError("the 'importance_sampling' kernel has no ratio bounds")
        if clipped:
            assert self.ratio_low is not None and self.ratio_high is not None
            if not (0.0 <= self.ratio_low <= 1.0 <= self.ratio_high < math.inf):
                raise ValueError(
                    f"ratio bounds [{self.ratio_low}, {self.ratio_high}] must satisfy"
                    " 0 <= low <= 1 <= high < inf"
                )

    def loss_fn_config(self) -> dict[str, float]:
        """The ``loss_fn_config`` the services read: the clip thresholds, for the clipped
        kernels; empty for ``importance_sampling``."""
        if self.ratio_low is None or self.ratio_high is None:
            return {}
        return {"clip_low_threshold": self.ratio_low, "clip_high_threshold": self.ratio_high}
