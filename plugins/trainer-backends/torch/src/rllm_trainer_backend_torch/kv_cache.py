"""A preallocated key/value cache with one slot per decoding sequence.

Hugging Face's ``DynamicCache`` concatenates every new key and value onto the whole past at
each step, which copies the cache once per token; its ``StaticCache`` writes in place but
gives every row the same position. Continuous batching needs both: rows at different
positions, written in place. :class:`SlotKVCache` keeps, per layer, one buffer of shape
``(slots, kv_heads, capacity, head_dim)``. Active sequences occupy slots ``0..n-1`` (the
sampler keeps them packed with :meth:`move`), so a decode step attends over a view of the
buffer, never a copy of it.

It plugs into the model's own forward as a ``transformers`` ``Cache`` whose ``update`` does
one of two things, chosen before each forward:

- :meth:`begin_prefill`: a batch-1 prompt forward. Keys and values go into one slot and are
  returned unchanged, so the model attends over the prompt alone with its usual causal mask
  (the cache reports no past, so the model builds that mask itself).
- :meth:`begin_extend`: a batch-1 forward of a prompt's remaining tokens after a start that
  :meth:`load` copied into the slot. Keys and values go in after that start, and the slot's
  positions up to the end of the new tokens are returned; the caller passes a 4-D causal mask
  over them.
- :meth:`begin_decode`: one new token for each of the first ``n`` slots at per-row positions.
  Each row's key and value are written at its position, and the first ``kv_len`` positions of
  all ``n`` slots are returned; the caller passes a 4-D mask hiding each row's positions past
  its own.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

__all__ = ["SlotKVCache"]

_CAPACITY_STEP = 64
"""Positions are allocated in multiples of this (and at least doubled when they grow), so
growth is rare. Decode steps attend over the first ``kv_len`` positions only, so the step costs
no time; it sets how much memory a short completion holds: 64 slots of SmolLM2-135M take
189 MB at 64 positions and 755 MB at 256."""


class SlotKVCache(Cache):
    """Per-layer ``(slots, kv_heads, capacity, head_dim)`` buffers, grown on demand.

    Buffers are created by the first prefill (which reveals heads, head size, dtype and device)
    and grow, never shrink, up to ``max_slots`` slots and ``max_positions`` positions, until
    :meth:`release` drops them. Memory: ``2 * layers * slots * kv_heads * capacity * head_dim``
    elements.
    """

    def __init__(self, max_slots: int, max_positions: int) -> None:
        super().__init__(layers=[])
        self.max_slots = max_slots
        self.max_positions = max_positions
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._slots = 0
        self._capacity = 0
        self._mode = ""
        self._slot = 0
        self._rows = 0
        self._row_index: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._kv_len = 0

    @property
    def capacity(self) -> int:
        """Positions currently allocated per slot."""
        return self._capacity

    def reserve(self, slots: int, positions: int) -> None:
        """Make room for ``slots`` slots of ``positions`` positions, keeping what is stored."""
        if slots > self.max_slots or positions > self.max_positions:
            raise ValueError(
                f"cache request of {slots} slots x {positions} positions exceeds the limit of"
                f" {self.max_slots} x {self.max_positions}"
            )
        want_slots = max(self._slots, slots)
        want_capacity = self._capacity
        if positions > self._capacity:
            rounded = -(-positions // _CAPACITY_STEP) * _CAPACITY_STEP
            want_capacity = min(self.max_positions, max(rounded, 2 * self._capacity))
        if want_slots > self._slots and self.keys:
            want_slots = min(self.max_slots, max(want_slots, 2 * self._slots))
        if (want_slots, want_capacity) == (self._slots, self._capacity):
            return
        if self.keys:
            self.keys = [self._grown(t, want_slots, want_capacity) for t in self.keys]
            self.values = [self._grown(t, want_slots, want_capacity) for t in self.values]
        self._slots, self._capacity = want_slots, want_capacity

    def release(self) -> None:
        """Drop every buffer (call it with no sequence decoding); the next prefill allocates
        them again."""
        self.keys, self.values = [], []
        self._slots = self._capacity = 0
        self._row_index = None
        self.end()

    def _grown(self, buffer: torch.Tensor, slots: int, capacity: int) -> torch.Tensor:
        # Zeros, not empty: masked positions are still multiplied by a zero weight, and
        # uninitialized memory may hold NaN, which would poison the row.
        bigger = buffer.new_zeros((slots, buffer.shape[1], capacity, buffer.shape[3]))
        bigger[: buffer.shape[0], :, : buffer.shape[2]] = buffer
        return bigger

    def begin_prefill(self, slot: int, length: int) -> None:
        """The next forward is one prompt of ``length`` tokens to store in ``slot``."""
        self.reserve(slot + 1, length)
        self._mode, self._slot = "prefill", slot

    def begin_extend(self, slot: int, start: int, length: int) -> None:
        """The next forward is ``length`` tokens at positions ``start..start+length-1`` of
        ``slot``, whose first ``start`` positions are already stored."""
        self.reserve(slot + 1, start + length)
        self._mode, self._slot, self._kv_len = "extend", slot, start

    def load(
        self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], length: int
    ) -> None:
        """Store the first ``length`` positions of per-layer ``(kv_heads, positions,
        head_dim)`` tensors in ``slot``; call :meth:`reserve` for room first."""
        if not self.keys:
            for key, value in zip(keys, values, strict=True):
                shape = (self._slots, key.shape[0], self._capacity)
                self.keys.append(key.new_zeros((*shape, key.shape[2])))
                self.values.append(value.new_zeros((*shape, value.shape[2])))
        for buffer, stored in zip((*self.keys, *self.values), (*keys, *values), strict=True):
            buffer[slot, :, :length] = stored[:, :length]

    def snapshot(self, slot: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the first ``length`` positions of ``slot``, per layer."""
        return (
            [buffer[slot, :, :length].clone() for buffer in self.keys],
            [buffer[slot, :, :length].clone() for buffer in self.values],
        )

    def begin_decode(self, rows: int, positions: torch.Tensor, kv_len: int) -> None:
        """The next forward feeds one token to each of slots ``0..rows-1``.

        ``positions`` (``rows`` long integers on the cache's device) is where each row's token
        goes; ``kv_len`` is one more than the largest of them.
        """
        if kv_len > self._capacity or rows > self._slots:
            raise ValueError(
                f"decode of {rows} rows up to position {kv_len} does not fit the reserved"
                f" {self._slots} slots x {self._capacity} positions; call reserve() first"
            )
        self._mode, self._rows, self._kv_len = "decode", rows, kv_len
        self._positions = positions
        if self._row_index is None or self._row_index.shape[0] < rows:
            self._row_index = torch.arange(self._slots, device=positions.device)

    def end(self) -> None:
        """Forget the pending forward (a failed forward must not leak into the next one)."""
        self._mode = ""
        self._positions = None

    def move(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``source`` into slot ``target``."""
        for buffer in (*self.keys, *self.values):
            buffer[target, :, :length] = buffer[source, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._mode == "prefill":
            if layer_idx == len(self.keys):
                self._allocate(key_states, value_states)
            length = key_states.shape[2]
            self.keys[layer_idx][self._slot, :, :length] = key_states[0]
            self.values[layer_idx][self._slot, :, :length] = value_states[0]
            return key_states, value_states
        if self._mode == "extend":
            slot, start = self._slot, self._kv_len
            end = start + key_states.shape[2]
            keys, values = self.keys[layer_idx], self.values[layer_idx]
            keys[slot, :, start:end] = key_states[0]
            values[slot, :, start:end] = value_states[0]
            return keys[slot : slot + 1, :, :end], values[slot : slot + 1, :, :end]
        if self._mode == "decode":
            rows, kv_len = self._rows, self._kv_len
            index = self._row_index[:rows]
            keys, values = self.keys[layer_idx], self.values[layer_idx]
            keys[index, :, self._positions] = key_states[:, :, 0]
            values[index, :, self._positions] = value_states[:, :, 0]
            return keys[:rows, :, :kv_len], values[:rows, :, :kv_len]
        raise RuntimeError(
            "SlotKVCache.update() outside begin_prefill()/begin_extend()/begin_decode()"
        )

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, heads, _, key_dim = key_states.shape
        value_dim = value_states.shape[3]
        shape = (self._slots, heads, self._capacity)
        self.keys.append(key_states.new_zeros((*shape, key_dim)))
        self.values.append(value_states.new_zeros((*shape, value_dim)))
