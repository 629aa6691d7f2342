"""Datums to right-padded ``[B, T]`` tensors, and their split into micro-batches.

A datum whose ``metadata["packed_lengths"]`` lists several lengths (summing to its token count)
holds that many examples one after another; its row gets position ids that restart at 0 at
each example's start, which is how the model keeps the examples apart (see
:func:`rllm_trainer_backend_torch.logprobs.token_logprobs`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from rllm_core.types import Datum

from rllm_trainer_backend_torch.prefix_tree import Trie

__all__ = ["PACKED_LENGTHS", "Collated", "collate", "count_examples", "packed_lengths"]

PACKED_LENGTHS = "packed_lengths"
"""The datum metadata key that splits a datum into packed examples."""


@dataclass(frozen=True, slots=True)
class Collated:
    """A batch of datums as CPU tensors, right-padded to the longest one.

    ``token_ids`` is int64; the rest are float32. Padding holds token 0, logprob 0, advantage 0
    and mask 0. ``lengths[b]`` is the unpadded length of row ``b``. ``proximal_logprobs`` and
    ``ref_logprobs`` are each ``None`` unless every datum carries them.
    """

    token_ids: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    observation_mask: torch.Tensor
    lengths: torch.Tensor
    proximal_logprobs: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.token_ids.shape[0])

    def micro_batches(
        self, size: int, max_tokens: int | None = None, *, shared: bool = False
    ) -> Iterator[Collated]:
        """Consecutive slices of at most ``size`` rows, each trimmed to its own longest row so a
        short micro-batch does not pay for a long one's padding. With ``max_tokens``, a slice
        also ends before the row that would take its tokens past that many (a row longer than
        ``max_tokens`` is a slice of its own): the memory of a forward pass grows with its
        tokens, so long sequences go fewer at a time. A slice's tokens are its rows times its
        width, or with ``shared`` the distinct prefixes of its rows (the tokens of their
        :class:`~rllm_trainer_backend_torch.prefix_tree.PrefixTree`)."""
        lengths = self.lengths.tolist()
        start = 0
        while start < self.size:
            end = self._slice_end(start, size, max_tokens, shared, lengths)
            rows = slice(start, end)
            width = max(lengths[rows])
            start = end
            yield Collated(
                token_ids=self.token_ids[rows, :width],
                rollout_logprobs=self.rollout_logprobs[rows, :width],
                advantages=self.advantages[rows, :width],
                action_mask=self.action_mask[rows, :width],
                observation_mask=self.observation_mask[rows, :width],
                lengths=self.lengths[rows],
                proximal_logprobs=None
                if self.proximal_logprobs is None
                else self.proximal_logprobs[rows, :width],
                position_ids=None if self.position_ids is None else self.position_ids[rows, :width],
                ref_logprobs=None if self.ref_logprobs is None else self.ref_logprobs[rows, :width],
            )

    def _slice_end(
        self, start: int, size: int, max_tokens: int | None, shared: bool, lengths: list[int]
    ) -> int:
        trie = Trie()
        if shared:
            trie.insert(self.token_ids[start, : lengths[start]].tolist())
        end, width = start + 1, lengths[start]
        while end < min(self.size, start + size):
            wider = max(width, lengths[end])
            tokens = wider * (end - start + 1)
            if shared:
                row = self.token_ids[end, : lengths[end]].tolist()
                tokens = len(trie) + len(row) - trie.matched(row)
            if max_tokens is not None and tokens > max_tokens:
                break
            if shared:
                trie.insert(row)
            end, width = end + 1, wider
        return end


def collate(datums: Sequence[Datum], *, vocab_size: int, max_length: int | None) -> Collated:
    """Pack ``datums`` into a :class:`Collated` batch.

    Raises ``ValueError``, naming the datum's index, for an empty batch or datum, a token id
    outside ``[0, vocab_size)``, a datum (or packed example) longer than ``max_length``, a mask
    set on position 0 or on a packed example's first token (no logprob exists for a token
    without a predecessor), ``packed_lengths`` that are not positive integers summing to the
    datum's length, or a non-finite value where a mask is set.
    """
    if not datums:
        raise ValueError("forward_backward got no datums; pass the optimizer step's datums")
    width = max(len(datum.token_ids) for datum in datums)
    shape = (len(datums), width)
    token_ids = torch.zeros(shape, dtype=torch.int64)
    floats = {name: torch.zeros(shape, dtype=torch.float32) for name in _FLOAT_FIELDS}
    lengths = torch.zeros(len(datums), dtype=torch.int64)
    packs = [packed_lengths(datum, index) for index, datum in enumerate(datums)]
    position_ids = None
    if any(pack is not None for pack in packs):
        position_ids = torch.arange(width, dtype=torch.int64).repeat(len(datums), 1)
    for index, datum in enumerate(datums):
        length = len(datum.token_ids)
        pack = packs[index]
        _check(index, datum, pack, vocab_size=vocab_size, max_length=max_length)
        if pack is not None and position_ids is not None:
            position_ids[index, :length] = torch.cat([torch.arange(n) for n in pack])
        lengths[index] = length
        token_ids[index, :length] = torch.tensor(datum.token_ids, dtype=torch.int64)
        for name, source in _FLOAT_FIELDS.items():
            floats[name][index, :length] = torch.tensor(getattr(datum, source), dtype=torch.float32)
    _check_finite(floats)
    return Collated(
        token_ids=token_ids,
        lengths=lengths,
        proximal_logprobs=_carried(datums, "proximal_logprobs", shape),
        ref_logprobs=_carried(datums, "ref_logprobs", shape),
        position_ids=position_ids,
        **floats,
    )


def packed_lengths(datum: Datum, index: int) -> list[int] | None:
    """The lengths of the examples packed into ``datum`` (``metadata["packed_lengths"]``), or
    ``None`` when it holds one example. Raises ``ValueError``, naming the datum's ``index``,
    when they are not positive integers summing to its length."""
    value = datum.metadata.get(PACKED_LENGTHS)
    if value is None:
        return None
    length = len(datum.token_ids)
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value)
    ):
        raise ValueError(
            f"datum {index} has metadata[{PACKED_LENGTHS!r}] = {value!r}; it must be a non-empty"
            f" list of positive token counts, one per packed example, summing to the datum's"
            f" {length} tokens"
        )
    if sum(value) != length:
        raise ValueError(
            f"datum {index} has metadata[{PACKED_LENGTHS!r}] summing to {sum(value)}, but it"
            f" holds {length} tokens; the packed examples' lengths must add up to the datum's"
            " length"
        )
    return list(value)


def count_examples(datums: Sequence[Datum]) -> int:
    """Examples in ``datums``: a packed datum counts each of its examples, any other one."""
    total = 0
    for datum in datums:
        value = datum.metadata.get(PACKED_LENGTHS)
        total += len(value) if isinstance(value, (list, tuple)) and value else 1
    return total


def _carried(datums: Sequence[Datum], field: str, shape: tuple[int, int]) -> torch.Tensor | None:
    carried = [getattr(d, field) is not None for d in datums]
    if not any(carried):
        return None
    if not all(carried):
        missing = carried.index(False)
        raise ValueError(
            f"datum {missing} has no {field} while others do; compute them for the whole batch"
        )
    out = torch.zeros(shape, dtype=torch.float32)
    for index, datum in enumerate(datums):
        values = getattr(datum, field)
        assert values is not None
        out[index, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


_FLOAT_FIELDS = {
    "rollout_logprobs": "logprobs",
    "advantages": "advantages",
    "action_mask": "action_mask",
    "observation_mask": "observation_mask",
}


def _check(
    index: int,
    datum: Datum,
    pack: list[int] | None,
    *,
    vocab_size: int,
    max_length: int | None,
) -> None:
    length = len(datum.token_ids)
    if length == 0:
        raise ValueError(f"datum {index} has no tokens; leave it out of the batch")
    if max_length is not None and pack is not None and max(pack) > max_length:
        example = pack.index(max(pack))
        raise ValueError(
            f"datum {index}'s packed example {example} has {max(pack)} tokens but the model's"
            f" context holds {max_length}; truncate or drop it before packing"
        )
    if max_length is not None and pack is None and length > max_length:
        raise ValueError(
            f"datum {index} has {length} tokens but the model's context holds {max_length};"
            " truncate or drop it before training"
        )
    low, high = min(datum.token_ids), max(datum.token_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"datum {index} holds token id {bad}, outside the model's vocabulary [0, {vocab_size});"
            " was it tokenized for another model?"
        )
    for mask in ("action_mask", "observation_mask"):
        if getattr(datum, mask)[0]:
            raise ValueError(
                f"datum {index} has {mask}[0] set, but the first token has no logprob (nothing"
                " precedes it); start the sequence with its prompt"
            )
    if pack is None:
        return
    start = 0
    for example, size in enumerate(pack):
        for mask in ("action_mask", "observation_mask"):
            if getattr(datum, mask)[start]:
                raise ValueError(
                    f"datum {index} has {mask}[{start}] set at the start of packed example"
                    f" {example}, but an example's first token has no logprob (nothing of its"
                    " own precedes it); start each example with its prompt"
                )
        start += size


def _check_finite(floats: dict[str, torch.Tensor]) -> None:
    trained = (floats["action_mask"] != 0) | (floats["observation_mask"] != 0)
    for name in ("rollout_logprobs", "advantages"):
        bad = (trained & ~torch.isfinite(floats[name])).nonzero()
        if len(bad):
            row, position = (int(i) for i in bad[0])
            value = float(floats[name][row, position])
            field = _FLOAT_FIELDS[name]
            raise ValueError(
                f"datum {row} has {field}[{position}] = {value} on a masked-in token; every"
                " trained token needs finite values"
            )
