"""Binary divergences between the current and the old probability of the sampled token.

"Binary" treats each token's distribution as two outcomes, the sampled token (probability p
under the current policy, q under the old one, the policy the trust region is anchored on) and
everything else (1 - p, 1 - q). Both functions take logprobs ``(logp, logq)``, return per-token
values without gradient, in at least float32, and are finite for any finite input:
log-probabilities above 0 count as probability 1.
"""

from __future__ import annotations

import torch

__all__ = ["KL_EPSILON", "binary_kl", "binary_tv"]

KL_EPSILON = 1e-8
"""Added to ``1 - p`` and ``1 - q`` inside the binary KL's second logarithm, as the DPPO
reference implementation does, so a probability of 1 gives a finite value."""


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
    """KL(old || current) between the two-outcome distributions ``(q, 1 - q)`` and
    ``(p, 1 - p)``, with ``p = exp(logp)`` current and ``q = exp(logq)`` old::

        q * (log q - log p) + (1 - q) * log((1 - q + 1e-8) / (1 - p + 1e-8))

    This is the direction (and the 1e-8) of the DPPO reference implementation: the divergence
    of the current policy from the old one, measured under the old one.
    ``log q - log p`` is taken as ``logq - logp`` and ``1 - p`` as ``-expm1(logp)``, both exact
    near the ends of [0, 1]. The 1e-8 makes the value finite when ``p = 1``; with it the value
    can dip a few 1e-8 below 0 next to ``p = q``, and it is clamped to 0 there.
    """
    logp, logq = _as_logs(logp, logq)
    q = torch.exp(logq)
    rest_p = -torch.expm1(logp)
    rest_q = -torch.expm1(logq)
    kl = q * (logq - logp) + rest_q * (
        torch.log(rest_q + KL_EPSILON) - torch.log(rest_p + KL_EPSILON)
    )
    return kl.clamp(min=0.0)
