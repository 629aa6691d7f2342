"""Keys and values of finished sequences, kept so that a later prompt starting with them skips
their forward.

A multi-turn episode sends each turn's prompt as the previous prompt, the completion and the
new observation, so without reuse every turn runs the whole conversation through the model
again: on a CPU, prompt forwards of a few thousand tokens then take most of a rollout. The
sampler stores each finished sequence's cache here and, when a prompt begins with a stored
sequence (or shares a long enough start with one, like a common system prompt), copies that
part into the new slot and runs only the rest.

Entries belong to one weight version: keys and values computed under other weights are wrong
for the new ones, so storing or looking up under a new version drops every older entry.
Memory is bounded by ``max_bytes``; the least recently used entries go first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

__all__ = ["PrefixCache", "PrefixHit"]

MIN_REUSE_TOKENS = 16
"""Shorter shared starts are run again: copying them costs about what computing them does."""


@dataclass(eq=False)
class _Entry:
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    nbytes: int


@dataclass(frozen=True)
class PrefixHit:
    """The first ``length`` positions of ``keys``/``values`` (one tensor per layer, shaped
    ``(kv_heads, positions, head_dim)``) are those of the prompt's first ``length`` tokens."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixCache:
    """Stored sequence caches of one weight version, least recently used first."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._version: int | None = None
        self._bytes = 0
        self._next_id = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        """Bytes the stored keys and values take."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def put(
        self,
        tokens: list[int],
        version: int,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> None:
        """Store the cache of ``tokens`` (per layer, ``(kv_heads, len(tokens), head_dim)``
        tensors the cache may keep) computed under weight ``version``."""
        if len(tokens) < MIN_REUSE_TOKENS:
            return
        self._switch(version)
        nbytes = sum(t.numel() * t.element_size() for t in (*keys, *values))
        if nbytes > self.max_bytes:
            return
        key = tuple(tokens)
        for entry_id, entry in list(self._entries.items()):
            # An entry that the new one extends is covered by it.
            if len(entry.tokens) <= len(key) and key[: len(entry.tokens)] == entry.tokens:
                self._drop(entry_id)
        self._entries[self._next_id] = _Entry(key, keys, values, nbytes)
        self._next_id += 1
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def lookup(self, prompt: list[int], version: int) -> PrefixHit | None:
        """The stored entry sharing the longest start with ``prompt`` under ``version``, if
        that start is at least :data:`MIN_REUSE_TOKENS` long. At most ``len(prompt) - 1``
        positions are reused: the last prompt token must run to give the next token's logits.
        """
        self._switch(version)
        prompt_key = tuple(prompt)
        best_id, best = None, 0
        for entry_id, entry in self._entries.items():
            shared = _common_prefix(prompt_key, entry.tokens)
            if shared > best:
                best_id, best = entry_id, shared
        best = min(best, len(prompt) - 1)
        if best_id is None or best < MIN_REUSE_TOKENS:
            return None
        self._entries.move_to_end(best_id)
        entry = self._entries[best_id]
        self.hits += 1
        self.reused_tokens += best
        return PrefixHit(best, entry.keys, entry.values)

    def _switch(self, version: int) -> None:
        if version != self._version:
            self.clear()
            self._version = version

    def _drop(self, entry_id: int) -> None:
        self._bytes -= self._entries.pop(entry_id).nbytes


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common start of ``a`` and ``b`` (slice comparisons run in C)."""
    high = min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
