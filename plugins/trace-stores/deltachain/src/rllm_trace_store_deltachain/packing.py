"""Byte layouts of token id and logprob arrays, chosen for how zstd compresses them.

Token ids (:func:`pack_ids`) are int32, little-endian, laid out in two parts: the low 16 bits of
every id side by side (two bytes per id, in order), then the third bytes of all ids, then the
fourth bytes. Text repeats sequences of token ids, and a repeated sequence stays one contiguous
run of bytes in the first part, which zstd finds as a single match (also against the context
dictionary of a conversation's earlier tokens). Vocabularies have fewer than 2**24 ids, so the
fourth bytes are all zero and the third bytes take a few values: both parts cost almost nothing.
Fully byte-transposed arrays compress random ids as well but text about 15% worse, because they
cut every repeated sequence into four.

Logprobs (:func:`pack_floats`) are little-endian float32 when every value survives the round trip
through float32 exactly (a sampler's float32 logprobs always do), else float64, and are
byte-transposed: all first bytes, then all second bytes, and so on. The last plane holds the sign
and the high exponent bits, which take a few values; the other planes are mantissa bits that
look random and do not compress.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence

from rllm_core.errors import StorageError

__all__ = ["count_ids", "join_ids", "pack_floats", "pack_ids", "unpack_floats", "unpack_ids"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_SWAP = sys.byteorder == "big"


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids in the layout of the module docstring: ``4 * len(ids)`` bytes. A value outside
    int32 is a ``ValueError`` naming it."""
    try:
        data = struct.pack(f"<{len(ids)}i", *ids)
    except struct.error:
        bad = next(v for v in ids if not (isinstance(v, int) and _INT32_MIN <= v <= _INT32_MAX))
        if not isinstance(bad, int):
            raise TypeError(f"token ids are integers, got {bad!r}") from None
        raise ValueError(
            f"token id {bad} does not fit in 32 bits; the delta-chain store keeps token ids as"
            " int32"
        ) from None
    count = len(ids)
    out = bytearray(len(data))
    out[0 : 2 * count : 2] = data[0::4]
    out[1 : 2 * count : 2] = data[1::4]
    out[2 * count : 3 * count] = data[2::4]
    out[3 * count :] = data[3::4]
    return bytes(out)


def unpack_ids(data: bytes) -> list[int]:
    """The inverse of :func:`pack_ids`; raises ``ValueError`` when the length is not a
    multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"packed token ids are 4 bytes each, got {len(data)} bytes")
    count = len(data) // 4
    raw = bytearray(len(data))
    raw[0::4] = data[0 : 2 * count : 2]
    raw[1::4] = data[1 : 2 * count : 2]
    raw[2::4] = data[2 * count : 3 * count]
    raw[3::4] = data[3 * count :]
    values = array.array("i")
    if values.itemsize != 4:
        raise StorageError(f"this platform's C int is {values.itemsize} bytes, not 4")
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def count_ids(packed: bytes) -> int:
    """How many ids ``packed`` holds."""
    return len(packed) // 4


def join_ids(packed: Sequence[bytes], *, last: int | None = None) -> bytes:
    """The packing of the concatenated id arrays ``packed`` (each packed by :func:`pack_ids`),
    keeping only the ``last`` ids when given."""
    counts = [len(item) // 4 for item in packed]
    skip = 0 if last is None else max(0, sum(counts) - last)
    views = [memoryview(item) for item in packed]
    pieces: list[memoryview] = []
    # Ranges of the three parts (low halves, third bytes, fourth bytes) after skipping the
    # first ``skip`` ids of the whole.
    for start, width in ((0, 2), (2, 1), (3, 1)):
        remaining = skip
        for view, count in zip(views, counts, strict=True):
            dropped = min(remaining, count)
            remaining -= dropped
            if dropped < count:
                pieces.append(view[start * count + width * dropped : (start + width) * count])
    return b"".join(pieces)


def _transpose(data: bytes, width: int) -> bytes:
    return b"".join(data[i::width] for i in range(width))


def _untranspose(data: bytes, width: int) -> bytes:
    count = len(data) // width
    out = bytearray(len(data))
    for i in range(width):
        out[i::width] = data[i * count : (i + 1) * count]
    return bytes(out)


def pack_floats(values: list[float]) -> tuple[bytes, int]:
    """Floats as transposed little-endian float32 when that keeps every bit, else float64;
    returns the bytes and the width (4 or 8). The last ``len(values)`` bytes are the plane of
    signs and high exponent bits."""
    narrow = array.array("f", values)
    if narrow.tolist() == values:
        packed, width = narrow, 4
    else:
        packed, width = array.array("d", values), 8
    if _SWAP:
        packed.byteswap()
    return _transpose(packed.tobytes(), width), width


def unpack_floats(data: bytes, width: int) -> list[float]:
    """The inverse of :func:`pack_floats`."""
    if width not in (4, 8) or len(data) % width:
        raise ValueError(f"{len(data)} bytes are not floats of width {width}")
    values = array.array("f" if width == 4 else "d")
    values.frombytes(_untranspose(data, width))
    if _SWAP:
        values.byteswap()
    return values.tolist()
