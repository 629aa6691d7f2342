"""The context a record's token ids are compressed against: the conversation just before them.

A child's prompt is its parent's prompt and completion followed by its own delta, so the tokens
a record stores continue the ones before it. Its tokens are compressed with the last
:data:`CONTEXT_TOKENS` tokens before them as a zstd raw-content dictionary: text that comes back
in a later turn (a file read again, a repeated tool schema, the same identifiers) then costs a
short reference instead of its bytes, as it would in one stream of the whole conversation.

The context is fixed when the record is written, so that nothing appended later changes how it
decodes. It is the *tail* of the record's *base*: the frame its parent had at that moment (a
replay writes a new frame and leaves the old one where it was). The tail of a frame is the last
:data:`CONTEXT_TOKENS` tokens of

- its snapshot and its completion, when it holds a snapshot;
- its delta and its completion, when it is a root;
- its base's tail, its delta and its completion, when its base's tail is known;

and unknown otherwise (its parent had not been written yet): its children are then compressed
alone. Records with a snapshot are always compressed alone, so that reading one never needs
another.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from rllm_trace_store_deltachain.packing import count_ids, join_ids

__all__ = ["CONTEXT_TOKENS", "MIN_CONTEXT_TOKENS", "TailCache", "extend_tail"]

CONTEXT_TOKENS = 2048
"""Tokens of context per record. Part of the format: changing it changes how records decode."""

MIN_CONTEXT_TOKENS = 16
"""A shorter context is not used: it would save less than it costs to set up."""


def extend_tail(tail: bytes | None, *packed: bytes) -> bytes:
    """The last :data:`CONTEXT_TOKENS` ids of ``tail`` followed by ``packed``; every argument
    and the result are id arrays packed by :func:`~rllm_trace_store_deltachain.packing.pack_ids`."""
    parts = packed if tail is None else (tail, *packed)
    return join_ids(parts, last=CONTEXT_TOKENS)


class TailCache:
    """Recently written tails (packed ids) by frame location, least recently used dropped first
    once they hold more than ``max_tokens`` ids. Not thread-safe: the store uses it under its
    lock."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._tails: OrderedDict[Hashable, bytes] = OrderedDict()
        self._tokens = 0

    def get(self, key: Hashable) -> bytes | None:
        tail = self._tails.get(key)
        if tail is not None:
            self._tails.move_to_end(key)
        return tail

    def put(self, key: Hashable, tail: bytes) -> None:
        old = self._tails.pop(key, None)
        if old is not None:
            self._tokens -= count_ids(old)
        self._tails[key] = tail
        self._tokens += count_ids(tail)
        while self._tokens > self.max_tokens and self._tails:
            _, dropped = self._tails.popitem(last=False)
            self._tokens -= count_ids(dropped)

    def clear(self) -> None:
        self._tails.clear()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._tails)
