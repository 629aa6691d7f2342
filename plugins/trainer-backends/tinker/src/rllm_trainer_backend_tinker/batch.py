"""Translate a training call's datums into Tinker datums (and, for ``forward_backward``,
right-padded tensors).

Tinker trains next-token prediction: a Tinker datum's ``model_input`` is the sequence without
its last token and ``target_tokens`` is the sequence shifted by one, so Tinker's logprob ``j``
belongs to token ``j + 1`` of the rllm datum. Token 0 has no logprob; it is never an action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tinker
import torch
from rllm_core.kit.managed.supervised import check_datum
from rllm_core.types import Datum

__all__ = ["Batch", "build_batch", "logprobs_matrix", "tinker_datum"]


@dataclass(frozen=True)
class Batch:
    """The datums of one call as Tinker sends them and as the losses see them (``[B, T]``)."""

    tinker_datums: list[tinker.types.Datum]
    lengths: list[int]
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    observation_mask: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return max(self.lengths)


def build_batch(datums: Sequence[Datum]) -> Batch:
    """Check and convert ``datums``; raises ``ValueError`` naming the first bad datum."""
    if not datums:
        raise ValueError("forward_backward got no datums; pass the optimizer step's datums")
    for index, datum in enumerate(datums):
        check_datum(index, datum)
    lengths = [len(datum.token_ids) for datum in datums]
    width = max(lengths)

    def padded(field: str) -> torch.Tensor:
        out = torch.zeros(len(datums), width, dtype=torch.float32)
        for row, datum in enumerate(datums):
            values = getattr(datum, field)
            out[row, : len(values)] = torch.tensor([float(v) for v in values])
        return out

    return Batch(
        tinker_datums=[
            tinker_datum(datum, [1.0 if m else 0.0 for m in datum.action_mask[1:]])
            for datum in datums
        ],
        lengths=lengths,
        rollout_logprobs=padded("logprobs"),
        advantages=padded("advantages"),
        action_mask=padded("action_mask"),
        observation_mask=padded("observation_mask"),
    )


def logprobs_matrix(logprobs_list: Sequence[torch.Tensor], batch: Batch) -> torch.Tensor:
    """Tinker's per-datum target logprobs as ``[B, T]`` aligned with the rllm tokens: position
    0 and padding hold 0.0, and gradients flow back to the tensors in ``logprobs_list``."""
    if len(logprobs_list) != batch.size:
        raise RuntimeError(
            f"Tinker returned logprobs for {len(logprobs_list)} datums but {batch.size} were sent"
        )
    rows = []
    for index, (values, length) in enumerate(zip(logprobs_list, batch.lengths, strict=True)):
        flat = values.reshape(-1).to(torch.float32)
        if flat.numel() != length - 1:
            raise RuntimeError(
                f"Tinker returned {flat.numel()} logprobs for datum {index}, which has"
                f" {length - 1} target tokens"
            )
        lead = torch.zeros(1, dtype=torch.float32)
        tail = torch.zeros(batch.width - length, dtype=torch.float32)
        rows.append(torch.cat([lead, flat, tail]))
    return torch.stack(rows)


def tinker_datum(datum: Datum, weights: list[float]) -> tinker.types.Datum:
    """``datum`` as a Tinker datum in the next-token layout, with one loss weight per target
    token (``weights``)."""
    tokens = [int(t) for t in datum.token_ids]
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.types.TensorData(
                data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
            ),
            "weights": tinker.types.TensorData(
                data=weights,
                dtype="float32",
                shape=[len(tokens) - 1],
            ),
        },
    )
