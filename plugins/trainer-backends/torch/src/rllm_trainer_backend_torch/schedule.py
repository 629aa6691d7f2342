"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay."""

from __future__ import annotations

import math

import torch

__all__ = ["build_scheduler", "lr_factor"]


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int | None) -> float:
    """The multiple of the peak learning rate that optimizer step ``step`` uses.

    ``step`` counts the optimizer steps taken before this one (0 for the first). Warmup:
    ``(step + 1) / warmup_steps`` while ``step < warmup_steps``, so no step runs at zero. Then,
    with ``D = total_steps - warmup_steps`` and ``k = step - warmup_steps``: ``constant`` is 1,
    ``linear`` is ``(D - k) / D`` and ``cosine`` is ``(1 + cos(pi * k / D)) / 2``; both reach 0
    at ``step = total_steps`` and stay there.

    Example: warmup 2, total 6, linear → 0.5, 1, 1, 0.75, 0.5, 0.25, 0, 0 ...
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"lr_schedule {schedule!r} needs total_steps")
    span = total_steps - warmup_steps
    done = min(step - warmup_steps, span)
    if schedule == "linear":
        return (span - done) / span
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done / span))
    raise ValueError(f"unknown lr_schedule {schedule!r}; use 'constant', 'linear' or 'cosine'")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    schedule: str,
    warmup_steps: int,
    total_steps: int | None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_factor`; step it once after each optimizer step.

    Its state dict holds only counters (``LambdaLR`` does not serialize a plain function), so a
    checkpoint restores it into a scheduler built from the same config.
    """

    def factor(step: int) -> float:
        return lr_factor(
            step, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)
