"""Per-token logprobs of a batch of sequences under a causal language model."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["target_logprobs", "token_logprobs"]


def token_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    needed: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, T]`` float32 logprobs: position ``t`` holds ``log p(token_ids[:, t] | tokens < t)``
    under ``softmax(logits / temperature)``; position 0 holds 0.

    ``token_ids`` must be right-padded. No attention mask is passed: with causal attention a
    real token never attends to the padding after it, and without a mask the model keeps its
    fastest attention path. Values at padded positions are meaningless; mask them.

    ``needed`` (``[B, T]``, nonzero where a logprob is used, such as the union of the action
    and observation masks) limits the output layer to the positions some row needs: the
    model's ``logits_to_keep`` then gets their indices, so the ``[B, T, V]`` logits and their
    gradient shrink to ``[B, T', V]`` (the prompt columns of a single-turn batch drop out),
    which saves memory and the output layer's time. Other positions hold 0, with no gradient.

    ``position_ids`` (``[B, T]``, for rows that pack several sequences) restart at 0 where each
    packed sequence starts. The model gets them, and with no attention mask its mask builder
    (transformers' ``create_causal_mask``) reads every restart as a sequence boundary and makes
    the causal mask block-diagonal: each sequence's logprobs equal those it has alone. A
    position whose id is 0 holds logprob 0, with no gradient, as position 0 does.
    """
    if needed is not None:
        columns = (needed != 0).any(dim=0).nonzero().squeeze(1)
        columns = columns[columns > 0]
        if 0 < len(columns) < token_ids.shape[1] - 1:
            predicted = _needed_logprobs(model, token_ids, columns, temperature, position_ids)
            return _zero_starts(predicted, position_ids)
    logits = model(input_ids=token_ids, position_ids=position_ids, use_cache=False).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # Position t of the logits predicts token t + 1; the last position predicts nothing and
    # is given any valid target, then dropped.
    targets = torch.nn.functional.pad(token_ids[:, 1:], (0, 1))
    predicted = target_logprobs(logits, targets)
    return _zero_starts(torch.nn.functional.pad(predicted[:, :-1], (1, 0)), position_ids)


def _zero_starts(logprobs: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    # A packed sequence's first token is predicted from the sequence before it: no logprob.
    if position_ids is None:
        return logprobs
    return torch.where(position_ids == 0, torch.zeros_like(logprobs), logprobs)


def _needed_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    columns: torch.Tensor,
    temperature: float,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    # The logits at position t - 1 predict the token at t.
    logits = model(
        input_ids=token_ids,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=columns - 1,
    ).logits
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    predicted = target_logprobs(logits, token_ids[:, columns])
    out = predicted.new_zeros(token_ids.shape)
    return out.index_copy(1, columns, predicted)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` at ``targets``: ``[..., V]`` logits and ``[...]`` int64
    targets give ``[...]`` logprobs.

    Same values as ``log_softmax(logits).gather(targets)``, computed as ``logit[target] -
    logsumexp(logits)``; the backward pass writes the gradient of the logits,
    ``grad * (onehot(target) - softmax(logits))``, into a single new ``[..., V]`` tensor. Only
    the logits (which the model produced anyway) and ``[...]``-sized tensors are kept for it.
    """
    return _TargetLogprob.apply(logits, targets)


class _TargetLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        index = targets.unsqueeze(-1)
        normalizer = torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(logits, index, normalizer)
        return logits.gather(-1, index).squeeze(-1) - normalizer

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        logits, index, normalizer = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        weight = grad.unsqueeze(-1)
        grad_logits = (logits - normalizer.unsqueeze(-1)).exp_()
        grad_logits.mul_(weight.neg())
        grad_logits.scatter_add_(-1, index, weight)
        return grad_logits, None
