"""Binary divergences between the current and the rollout probability of the sampled token.

"Binary" treats each token's distribution as two outcomes, the sampled token (probability p
now, q at rollout) and everything else (1 - p, 1 - q). Both functions take logprobs, return
per-token values without gradient, in at least float32, and are finite for any finite input:
log-probabilities above 0 count as probability 1.
"""

from __future__ import annotations

import torch

__all__ = ["binary_kl", "binary_tv"]


def _as_logs(logp: torch.Tensor, logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(torch.promote_types(logp.dtype, logq.dtype), torch.float32)
    return (
        logp.detach().to(dtype).clamp(max=0.0),
        logq.detach().to(dtype).clamp(max=0.0),
    )


def binary_tv(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``|p - q|`` with ``p = exp(logp)``, ``q = exp(logq)``."""
    logp, logq = _as_logs(logp, logq)
    return (torch.exp(logp) - torch.exp(logq)).abs()


def binary_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``p * log(p / q) + (1 - p) * log((1 - p) / (1 - q))``: KL(current || rollout) between
    the two-outcome distributions ``(p, 1 - p)`` and ``(q, 1 - q)``.

    ``log(p / q)`` is taken as ``logp - logq`` and ``1 - p`` as ``-expm1(logp)``, both exact near
    the ends of [0, 1]; ``1 - p`` and ``1 - q`` are floored at the dtype's smallest normal number
    so a probability of 1 gives a finite value, and rounding below 0 is clamped to 0.
    """
    logp, logq = _as_logs(logp, logq)
    tiny = torch.finfo(logp.dtype).tiny
    p = torch.exp(logp)
    rest_p = (-torch.expm1(logp)).clamp(min=tiny)
    rest_q = (-torch.expm1(logq)).clamp(min=tiny)
    kl = p * (logp - logq) + rest_p * (torch.log(rest_p) - torch.log(rest_q))
    return kl.clamp(min=0.0)
