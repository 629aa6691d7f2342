"""Reduce per-token loss values to one scalar with the normalizers of a whole optimizer step.

A trainer counts, once per optimizer step, the masked tokens and the sequences of all its
micro-batches (:func:`step_normalizers`) and builds one aggregate from them
(:func:`make_aggregate`). Every micro-batch loss reduces through that aggregate, so the sum of
the micro-batch losses equals the loss of the whole step computed at once, however the step is
split.

Modes, with ``m`` the mask, ``v`` the values, ``N_tok`` and ``N_seq`` the step's totals:

- ``token-mean``: ``sum(v * m) / N_tok``.
- ``seq-mean-token-mean``: ``sum_b(sum_t(v * m)[b] / tokens[b]) / N_seq``; a sequence without a
  masked token contributes 0.
- ``seq-mean-token-sum``: ``sum(v * m) / N_seq``.
- ``seq-mean-token-sum-norm``: ``sum(v * m) / (N_seq * norm_length)`` with a constant
  ``norm_length`` (Dr. GRPO).

A mask entry selects its token when it is nonzero. Values at unselected positions never reach
the result, even when they are not finite, and receive exactly zero gradient. When a normalizer
is zero the step has no selected token, and the aggregate is 0 rather than NaN.

An aggregate reduces with its own mode unless the call names another (``aggregate(values,
mask, mode="seq-mean-token-sum")``): the step's normalizers serve every mode, so a loss that
reduces a term its own way stays invariant to the micro-batch split. :func:`seq_reduce` gives
the per-sequence sums or means those modes are built from.

This module imports torch only for type checking, so plan validation can read
:data:`AGGREGATION_MODES` without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING

from rllm_core.ports.losses import SEQ_REDUCTIONS, seq_reduce

if TYPE_CHECKING:
    import torch

__all__ = [
    "AGGREGATION_MODES",
    "MaskAwareAggregate",
    "StepAggregate",
    "SEQ_REDUCTIONS",
    "make_aggregate",
    "seq_reduce",
    "step_normalizers",
]

AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
"""The aggregation modes a plan may name, in documentation order."""


def step_normalizers(masks: Iterable[torch.Tensor]) -> tuple[int, int]:
    """Count ``(total_tokens, total_sequences)`` over an optimizer step's micro-batch masks.

    Each mask is ``[B, T]``. ``total_tokens`` is the number of nonzero entries;
    ``total_sequences`` the number of rows holding at least one, so fully masked rows (batch
    padding, a sequence with nothing to train) do not dilute the per-sequence modes.
    """
    total_tokens = 0
    total_sequences = 0
    for index, mask in enumerate(masks):
        if mask.dim() != 2:
            raise ValueError(
                f"mask {index} has shape {tuple(mask.shape)}; step_normalizers expects [B, T]"
                " masks, one per micro-batch"
            )
        selected = mask != 0
        total_tokens += int(selected.sum().item())
        total_sequences += int(selected.any(dim=-1).sum().item())
    return total_tokens, total_sequences


@dataclass(frozen=True, slots=True)
class StepAggregate:
    """An :data:`~rllm_core.ports.Aggregate` bound to one optimizer step's normalizers.

    ``total_tokens`` and ``total_sequences`` count over the WHOLE step (see
    :func:`step_normalizers`), not over the micro-batch being reduced. ``norm_length`` is the
    constant length of ``seq-mean-token-sum-norm``: required when that is the mode, kept for a
    call that asks for it otherwise. Invalid arguments raise ``ValueError`` on construction.
    """

    mode: str
    total_tokens: int
    total_sequences: int
    norm_length: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in AGGREGATION_MODES:
            raise ValueError(
                f"unknown aggregation mode {self.mode!r}; valid modes:"
                f" {', '.join(AGGREGATION_MODES)}"
            )
        for label in ("total_tokens", "total_sequences"):
            count = getattr(self, label)
            if isinstance(count, bool) or not isinstance(count, Integral) or count < 0:
                raise ValueError(
                    f"{label} must be a non-negative integer count over the optimizer step,"
                    f" got {count!r}; count it with step_normalizers(masks)"
                )
            object.__setattr__(self, label, int(count))
        object.__setattr__(self, "norm_length", self._checked_norm_length())

    def _checked_norm_length(self) -> float | None:
        length = self.norm_length
        if length is None:
            if self.mode != "seq-mean-token-sum-norm":
                return None
            raise ValueError(
                "aggregation mode 'seq-mean-token-sum-norm' needs norm_length, the constant"
                " length each sequence's token sum is divided by (for example the maximum"
                " response length)"
            )
        if (
            isinstance(length, bool)
            or not isinstance(length, Real)
            or not math.isfinite(length)
            or length <= 0
        ):
            raise ValueError(f"norm_length must be a finite positive number, got {length!r}")
        return float(length)

    def __call__(
        self, values: torch.Tensor, mask: torch.Tensor, *, mode: str | None = None
    ) -> torch.Tensor:
        """Reduce ``values`` ``[B, T]`` over ``mask`` ``[B, T]`` to a 0-dim tensor, with this
        aggregate's mode or the ``mode`` named (one of :data:`AGGREGATION_MODES`)."""
        mode = self.mode if mode is None else mode
        if mode not in AGGREGATION_MODES:
            raise ValueError(
                f"aggregate(mode={mode!r}) is not an aggregation mode; valid modes:"
                f" {', '.join(AGGREGATION_MODES)}"
            )
        if values.dim() != 2 or values.shape != mask.shape:
            raise ValueError(
                f"aggregate expects values and mask of the same [B, T] shape, got values"
                f" {tuple(values.shape)} and mask {tuple(mask.shape)}"
            )
        if mode == "seq-mean-token-mean":
            return seq_reduce(values, mask, "mean").sum() / _nonzero(self.total_sequences)
        total = values.where(mask != 0, 0.0).sum()
        if mode == "token-mean":
            return total / _nonzero(self.total_tokens)
        if mode == "seq-mean-token-sum":
            return total / _nonzero(self.total_sequences)
        if self.norm_length is None:
            raise ValueError(
                "aggregate(mode='seq-mean-token-sum-norm') needs the constant norm_length; set"
                " [algorithm].norm_length in the plan"
            )
        return total / _nonzero(self.total_sequences * self.norm_length)


def make_aggregate(
    mode: str,
    *,
    total_tokens: int,
    total_sequences: int,
    norm_length: float | None = None,
) -> StepAggregate:
    """Build the aggregate of one optimizer step (see :class:`StepAggregate` for the
    arguments)."""
    return StepAggregate(
        mode=mode,
        total_tokens=total_tokens,
        total_sequences=total_sequences,
        norm_length=norm_length,
    )


def _nonzero(normalizer: float) -> float:
    """A zero normalizer means the step selected no token, so the numerator is 0 too."""
    return normalizer if normalizer > 0 else 1.0


class MaskAwareAggregate:
    """The :data:`~rllm_core.ports.Aggregate` a trainer puts in a loss context: it reduces with
    the observation-mask normalizers when given the context's ``observation_mask`` (that
    tensor, or one selecting exactly the same tokens and not exactly the action tokens), and
    with the action-mask normalizers otherwise.
    """

    def __init__(
        self,
        *,
        action: StepAggregate,
        observation: StepAggregate,
        action_mask: torch.Tensor,
        observation_mask: torch.Tensor,
    ) -> None:
        self.action = action
        self.observation = observation
        self._action_mask = action_mask
        self._observation_mask = observation_mask

    def __call__(
        self, values: torch.Tensor, mask: torch.Tensor, *, mode: str | None = None
    ) -> torch.Tensor:
        side = self.observation if self.is_observation(mask) else self.action
        return side(values, mask, mode=mode)

    def is_observation(self, mask: torch.Tensor) -> bool:
        if mask is self._observation_mask:
            return True
        if mask is self._action_mask or mask.shape != self._observation_mask.shape:
            return False
        selects = mask != 0
        return bool(
            selects.equal(self._observation_mask != 0) and not selects.equal(self._action_mask != 0)
        )
