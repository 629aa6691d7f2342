"""Choosing the next token of every decoding row at once.

Each row has its own temperature, top-p and one uniform draw per token, taken from the row's
own random stream by the caller; that is what keeps a seeded row independent of its
neighbours. Sampling inverts the cumulative distribution: the token is the first whose
cumulative probability exceeds ``u`` times the total mass. Cumulative sums are taken in
float64 so that rounding over a large vocabulary does not move mass between tokens. Rows are
grouped (greedy, full distribution, nucleus) so that a batch costs a few vectorised ops per
group, and the sort that top-p needs is paid only by the rows that ask for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["choose_tokens"]


def choose_tokens(
    logits: torch.Tensor,
    temperature: Sequence[float],
    top_p: Sequence[float],
    uniform: Sequence[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns ``(token_ids, logprobs)``, both of shape ``(rows,)``.

    - ``logits``: ``(rows, vocab)``.
    - ``temperature``: per row; 0 is greedy: the argmax, with its logprob under the
      untempered softmax.
    - ``top_p``: per row, in ``(0, 1]``; a row's nucleus is the smallest set of most probable
      tokens whose mass reaches ``top_p`` (a token stays while the mass ranked above it is
      below ``top_p``, so the most probable token always stays).
    - ``uniform``: per row, a draw in ``[0, 1)`` (ignored by greedy rows).

    The logprob is that of the chosen token under ``softmax(logits / temperature)``, before
    top-p truncation.
    """
    rows = logits.shape[0]
    device = logits.device
    scale = torch.tensor([t if t > 0 else 1.0 for t in temperature], device=device)
    logprobs = torch.log_softmax(logits.float() / scale[:, None], dim=-1)
    token_ids = torch.empty(rows, dtype=torch.long, device=device)
    draws = torch.tensor(uniform, dtype=torch.float64, device=device)
    greedy, full, nucleus = [], [], []
    for i in range(rows):
        if temperature[i] <= 0:
            greedy.append(i)
        elif top_p[i] >= 1.0:
            full.append(i)
        else:
            nucleus.append(i)
    if greedy:
        index = _index(greedy, rows, device)
        token_ids[index] = logprobs[index].argmax(dim=-1)
    if full:
        index = _index(full, rows, device)
        token_ids[index] = _invert(logprobs[index].exp(), draws[index])
    if nucleus:
        index = _index(nucleus, rows, device)
        limits = torch.tensor([top_p[i] for i in nucleus], dtype=torch.float64, device=device)
        token_ids[index] = _invert_nucleus(logprobs[index], limits, draws[index])
    return token_ids, logprobs.gather(1, token_ids[:, None]).squeeze(1)


def _index(members: list[int], rows: int, device: torch.device) -> slice | torch.Tensor:
    if len(members) == rows:
        return slice(None)
    return torch.tensor(members, dtype=torch.long, device=device)


def _invert(probs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative probability exceeds ``draw * total``, per row."""
    cumulative = probs.cumsum(dim=-1, dtype=torch.float64)
    target = draws[:, None] * cumulative[:, -1:]
    chosen = torch.searchsorted(cumulative, target, right=True).squeeze(1)
    return chosen.clamp_(max=probs.shape[1] - 1)


def _invert_nucleus(
    logprobs: torch.Tensor, limits: torch.Tensor, draws: torch.Tensor
) -> torch.Tensor:
    sorted_logprobs, order = logprobs.sort(dim=-1, descending=True)
    sorted_probs = sorted_logprobs.exp()
    cumulative = sorted_probs.cumsum(dim=-1, dtype=torch.float64)
    mass_above = torch.nn.functional.pad(cumulative[:, :-1], (1, 0))
    kept = torch.searchsorted(mass_above, limits[:, None], right=False)
    kept_mass = cumulative.gather(1, kept - 1)
    rank = torch.searchsorted(cumulative, draws[:, None] * kept_mass, right=True)
    rank = torch.minimum(rank, kept - 1)
    return order.gather(1, rank).squeeze(1)
