"""Tensor helpers shared by loss implementations: masked inputs, safe log-ratios, masked
statistics for metrics. Imports torch; only loss implementations (never entry modules) use it."""

from __future__ import annotations

import torch

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to +-20 (ratios within about 2e-9 .. 4.9e8) before ``exp``, so a ratio
stays finite in every float dtype a trainer uses and its products with advantages cannot
overflow. Beyond the limit the ratio is constant, so such a token contributes no gradient
through it."""


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is true and exactly 0 elsewhere, with exactly zero gradient
    there whatever the masked values are (padding may hold anything)."""
    return torch.where(mask, values, torch.zeros_like(values))


def log_ratio(logprobs: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logprobs - reference``, clamped to :data:`LOG_RATIO_LIMIT`, on ``mask``; 0 elsewhere.
    ``reference`` is treated as a constant."""
    diff = (logprobs - reference.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return masked(diff, mask)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Unweighted mean of ``values`` over ``mask`` as a float; 0.0 when the mask is empty."""
    selected = values.detach()[mask].double()
    return float(selected.mean()) if selected.numel() else 0.0


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest value over ``mask`` as a float; 0.0 when the mask is empty."""
    selected = values.detach()[mask]
    return float(selected.max()) if selected.numel() else 0.0


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Smallest value over ``mask`` as a float; 0.0 when the mask is empty."""
    selected = values.detach()[mask]
    return float(selected.min()) if selected.numel() else 0.0


def fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of ``mask`` positions where ``flags`` is true; 0.0 when the mask is empty."""
    return masked_mean(flags.to(torch.float64), mask)
