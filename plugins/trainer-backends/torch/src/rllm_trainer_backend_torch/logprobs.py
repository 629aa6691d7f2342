"""Per-token logprobs of a batch of sequences under a causal language model."""

from __future__ import annotations

from typing import Any

import torch
from rllm_core.algorithms.reference_kl import entropy_from_logits

from rllm_trainer_backend_torch.prefix_tree import PrefixTree

__all__ = [
    "MASKABLE_ATTENTION",
    "check_maskable_attention",
    "shared_prefix_logprobs",
    "target_logprobs",
    "token_logprobs",
]

MASKABLE_ATTENTION = ("sdpa", "eager")
"""Attention implementations that apply an arbitrary 4D attention mask (flash attention and
others assume a causal or padding mask and would ignore a tree's)."""


def token_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    needed: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    entropy: bool = False,
) -> Any:
    """``[B, T]`` float32 logprobs: position ``t`` holds ``log p(token_ids[:, t] | tokens < t)``
    under ``softmax(logits / temperature)``; position 0 holds 0.

    ``token_ids`` must be right-padded. No attention mask is passed: with causal attention a
    real token never attends to the padding after it, and without a mask the model keeps its
    fastest attention path. Values at padded positions are meaningless; mask them.

    ``needed`` (``[B, T]``, nonzero where a logprob is used, such as the action mask) limits
    the output layer to exactly those positions: a forward pre-hook on the model's output
    embeddings hands it the hidden states of the ``N`` needed positions alone, so the
    ``[B, T, V]`` logits and their gradient shrink to ``[N, V]`` (what follows the output layer
    in a model's forward, such as soft-capping, is elementwise). That saves memory and the
    output layer's time; the rows of a multi-turn batch need different positions, so this beats
    keeping the columns any row needs. Other positions hold 0, with no gradient.

    ``position_ids`` (``[B, T]``, for rows that pack several sequences) restart at 0 where each
    packed sequence starts. The model gets them, and with no attention mask its mask builder
    (transformers' ``create_causal_mask``) reads every restart as a sequence boundary and makes
    the causal mask block-diagonal: each sequence's logprobs equal those it has alone. A
    position whose id is 0 holds logprob 0, with no gradient, as position 0 does.

    With ``entropy``, returns ``(logprobs, entropy)``: ``entropy[:, t]`` is the entropy of the
    same tempered distribution that gives position ``t`` its logprob (the one predicting token
    ``t``), with gradient, and 0 wherever the logprob is 0 by construction.
    """
    if needed is not None:
        rows, columns = (needed[:, 1:] != 0).nonzero(as_tuple=True)
        if 0 < len(rows) < needed.numel() - needed.shape[0]:
            predicted = _needed_logprobs(
                model, token_ids, rows, columns + 1, temperature, position_ids, entropy
            )
            if entropy:
                return tuple(_zero_starts(p, position_ids) for p in predicted)
            return _zero_starts(predicted, position_ids)
    logits = model(input_ids=token_ids, position_ids=position_ids, use_cache=False).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # Position t of the logits predicts token t + 1; the last position predicts nothing and
    # is given any valid target, then dropped.
    targets = torch.nn.functional.pad(token_ids[:, 1:], (0, 1))
    predicted = _zero_starts(
        torch.nn.functional.pad(target_logprobs(logits, targets)[:, :-1], (1, 0)), position_ids
    )
    if not entropy:
        return predicted
    entropies = torch.nn.functional.pad(entropy_from_logits(logits[:, :-1]), (1, 0))
    return predicted, _zero_starts(entropies, position_ids)


def _zero_starts(logprobs: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    # A packed sequence's first token is predicted from the sequence before it: no logprob.
    if position_ids is None:
        return logprobs
    return torch.where(position_ids == 0, torch.zeros_like(logprobs), logprobs)


def _needed_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    rows: torch.Tensor,
    columns: torch.Tensor,
    temperature: float,
    position_ids: torch.Tensor | None,
    entropy: bool = False,
) -> Any:
    # The hidden state at position t - 1 predicts the token at t.
    def gather(module: torch.nn.Module, args: tuple) -> tuple:
        return (args[0][rows, columns - 1].unsqueeze(0), *args[1:])

    hook = _output_layer(model).register_forward_pre_hook(gather)
    try:
        logits = model(
            input_ids=token_ids, position_ids=position_ids, use_cache=False, logits_to_keep=0
        ).logits[0]
    finally:
        hook.remove()
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    predicted = target_logprobs(logits, token_ids[rows, columns])
    out = predicted.new_zeros(token_ids.shape).index_put((rows, columns), predicted)
    if not entropy:
        return out
    entropies = entropy_from_logits(logits)
    return out, entropies.new_zeros(token_ids.shape).index_put((rows, columns), entropies)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    lengths: torch.Tensor,
    *,
    device: torch.device | str = "cpu",
    temperature: float = 1.0,
    needed: torch.Tensor | None = None,
    entropy: bool = False,
) -> Any:
    """The same ``[B, T]`` logprobs as :func:`token_logprobs` (with ``needed``; with
    ``entropy``, the pair of logprobs and entropies), computed in
    one forward pass over the rows packed as a :class:`~rllm_trainer_backend_torch.prefix_tree.
    PrefixTree`: a prefix several rows share runs once, its gradient the sum of theirs.

    ``token_ids`` (right-padded) and ``lengths`` are CPU tensors; ``needed`` defaults to every
    position of every row. The output layer runs once per distinct (prefix, next token) pair
    among the needed positions. Raises ``ValueError`` for a model whose attention
    implementation would not apply the tree's mask.
    """
    check_maskable_attention(model)
    tree = PrefixTree.of(token_ids, lengths)
    if needed is None:
        needed = torch.arange(token_ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    rows, columns = (needed[:, 1:].cpu() != 0).nonzero(as_tuple=True)
    columns = columns + 1
    out = torch.zeros(token_ids.shape, dtype=torch.float32, device=device)
    if len(rows) == 0:
        return (out, out.clone()) if entropy else out
    nodes, which = tree.index[rows, columns].unique(return_inverse=True)
    parents = tree.parents[nodes].to(device)

    def gather(module: torch.nn.Module, args: tuple) -> tuple:
        return (args[0][0, parents].unsqueeze(0), *args[1:])

    dtype = next(model.parameters()).dtype
    hook = _output_layer(model).register_forward_pre_hook(gather)
    try:
        logits = model(
            input_ids=tree.token_ids.to(device).unsqueeze(0),
            position_ids=tree.position_ids.to(device).unsqueeze(0),
            attention_mask=tree.attention_mask(dtype).to(device),
            use_cache=False,
            logits_to_keep=0,
        ).logits[0]
    finally:
        hook.remove()
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    predicted = target_logprobs(logits, tree.token_ids[nodes].to(device))
    where = (rows.to(device), columns.to(device))
    logprobs = out.index_put(where, predicted[which.to(device)])
    if not entropy:
        return logprobs
    return logprobs, out.index_put(where, entropy_from_logits(logits)[which.to(device)])


def check_maskable_attention(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` unless ``model`` applies a custom 4D attention mask."""
    attention = getattr(getattr(_unwrapped(model), "config", None), "_attn_implementation", None)
    if attention not in MASKABLE_ATTENTION:
        raise ValueError(
            f"the model's attention implementation is {attention!r}, which ignores the custom"
            f" attention mask that [trainer].share_prefixes needs; load the model with one of"
            f" {MASKABLE_ATTENTION} or set share_prefixes = false"
        )


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    # A DistributedDataParallel wrapper holds the model as ``module``.
    while not hasattr(model, "get_output_embeddings") and hasattr(model, "module"):
        model = model.module
    return model


def _output_layer(model: torch.nn.Module) -> torch.nn.Module:
    return _unwrapped(model).get_output_embeddings()


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
