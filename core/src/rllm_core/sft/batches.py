"""Which examples each SFT step trains on: the eval split, epochs, shuffling and packing.

Everything is seeded by ``[run].seed`` alone: the held-out examples of ``eval_fraction`` are
those of a seeded permutation's head; epoch ``e`` visits the training examples in
``random.Random(f"{seed}:sft:{e}")`` order, in batches of ``batch_size`` (the last batch of an
epoch may hold fewer: no example is skipped). With packing, the examples of a batch are laid
into rows of at most ``max_length`` tokens (first fit, in order), one datum per row.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TypeVar

from rllm_core.sft.data import TokenExample
from rllm_core.sft.tokens import supervised_datum
from rllm_core.types import Datum

__all__ = ["batch_datums", "epoch_batches", "split_eval", "steps_per_epoch"]

T = TypeVar("T")


def split_eval(items: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """``(train, eval)``: ``round(fraction * len)`` items held out (at least one when
    ``fraction`` > 0 and there are two or more), chosen by a seeded permutation; each part
    keeps the original order."""
    if fraction <= 0 or len(items) < 2:
        return list(items), []
    count = min(len(items) - 1, max(1, round(fraction * len(items))))
    order = list(range(len(items)))
    random.Random(f"{seed}:sft:eval").shuffle(order)
    held = set(order[:count])
    return (
        [x for i, x in enumerate(items) if i not in held],
        [x for i, x in enumerate(items) if i in held],
    )


def steps_per_epoch(examples: int, batch_size: int) -> int:
    return math.ceil(examples / batch_size)


def epoch_batches(count: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The example indices of each step of ``epoch``, in order."""
    order = list(range(count))
    random.Random(f"{seed}:sft:{epoch}").shuffle(order)
    return [order[i : i + batch_size] for i in range(0, count, batch_size)]


def batch_datums(
    examples: Sequence[TokenExample], *, packing: bool, max_length: int | None
) -> list[Datum]:
    """The datums of one step: one per example, or with ``packing`` one per row of at most
    ``max_length`` tokens."""
    if not packing:
        return [supervised_datum([e]) for e in examples]
    if max_length is None:
        raise ValueError("packing needs max_length")
    rows: list[list[TokenExample]] = []
    sizes: list[int] = []
    for example in examples:
        size = len(example.token_ids)
        for index, used in enumerate(sizes):
            if used + size <= max_length:
                rows[index].append(example)
                sizes[index] += size
                break
        else:
            rows.append([example])
            sizes.append(size)
    return [supervised_datum(row, packed=True) for row in rows]
