"""The bytes of one stored entry: a trace record (with an optional snapshot) or a tombstone.

An entry is a msgpack array whose first element names its kind:

- ``["r", session_id, trace_id, parent_trace_id, lineage_id, turn, has_snapshot, body]``: a
  record. The head stays uncompressed so that opening a store indexes it without decompressing
  anything; ``body`` is a zstd frame holding the msgpack array :class:`_Body`.
- ``["d", session_id]``: a tombstone; the session's earlier records are deleted.

An id made of lowercase hex digit pairs (a ``uuid4().hex`` trace id) is stored as the msgpack
binary of its bytes, half the size of the text; any other id is stored as text.

Token id arrays are little-endian int32 and logprobs little-endian float32 when every value
survives the round trip through float32 exactly (a sampler's float32 logprobs always do), else
float64, so reads are bit-exact. Before compression each array is byte-transposed: all first
bytes, then all second bytes, and so on. Token ids below 2**24 have a zero top byte, and ids of
one vocabulary share their high bytes, so the transposed planes compress far better than the
interleaved array.
"""

from __future__ import annotations

import array
import re
import sys
from typing import Any

import msgspec
import zstandard
from rllm_core.errors import StorageError
from rllm_core.types import Message, TraceRecord

__all__ = [
    "EntryCodec",
    "RecordHead",
    "Tombstone",
    "pack_floats",
    "pack_ids",
    "unpack_floats",
    "unpack_ids",
]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_SWAP = sys.byteorder == "big"


_HEX_PAIRS = re.compile(r"(?:[0-9a-f]{2})+")


class RecordHead(msgspec.Struct, frozen=True):
    """What opening a store keeps in its index about a record."""

    session_id: str
    trace_id: str
    parent_trace_id: str | None
    lineage_id: str
    turn: int
    has_snapshot: bool


class Tombstone(msgspec.Struct, frozen=True):
    """Deletes every earlier record of ``session_id``."""

    session_id: str


# Ids are ``Any`` on the wire: text, or the bytes of a hex id (see the module docstring).
class _StoredHead(msgspec.Struct, array_like=True, tag="r"):
    session_id: Any
    trace_id: Any
    parent_trace_id: Any
    lineage_id: str
    turn: int
    has_snapshot: bool


class _StoredRecord(_StoredHead, tag="r"):
    body: bytes


class _StoredTombstone(msgspec.Struct, array_like=True, tag="d"):
    session_id: Any


class _Body(msgspec.Struct, array_like=True):
    prompt_delta: bytes
    completion: bytes
    logprobs: bytes
    logprob_bytes: int
    finish_reason: str
    weight_version: int
    model: str
    messages_delta: tuple[Message, ...]
    reset_reason: str | None
    created_at: float
    latency_s: float
    snapshot: bytes | None


def _compact_id(value: str | None) -> str | bytes | None:
    if value is not None and _HEX_PAIRS.fullmatch(value):
        return bytes.fromhex(value)
    return value


def _expand_id(value: Any, *, optional: bool = False) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, str) or (optional and value is None):
        return value
    raise ValueError(f"an id must be text or bytes, found {type(value).__name__}")


def _transpose(data: bytes, width: int) -> bytes:
    return b"".join(data[i::width] for i in range(width))


def _untranspose(data: bytes, width: int) -> bytes:
    count = len(data) // width
    out = bytearray(len(data))
    for i in range(width):
        out[i::width] = data[i * count : (i + 1) * count]
    return bytes(out)


def pack_ids(ids: list[int]) -> bytes:
    """Token ids as transposed little-endian int32 bytes; a value outside int32 is an error."""
    try:
        packed = array.array("i", ids)
    except OverflowError:
        bad = next(v for v in ids if not _INT32_MIN <= v <= _INT32_MAX)
        raise ValueError(
            f"token id {bad} does not fit in 32 bits; the delta-chain store keeps token ids as"
            " int32"
        ) from None
    if packed.itemsize != 4:
        raise StorageError(f"this platform's C int is {packed.itemsize} bytes, not 4")
    if _SWAP:
        packed.byteswap()
    return _transpose(packed.tobytes(), 4)


def unpack_ids(data: bytes) -> list[int]:
    """The inverse of :func:`pack_ids`."""
    values = array.array("i")
    values.frombytes(_untranspose(data, 4))
    if _SWAP:
        values.byteswap()
    return values.tolist()


def pack_floats(values: list[float]) -> tuple[bytes, int]:
    """Floats as transposed little-endian float32 when that keeps every bit, else float64;
    returns the bytes and the width (4 or 8)."""
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
    values = array.array("f" if width == 4 else "d")
    values.frombytes(_untranspose(data, width))
    if _SWAP:
        values.byteswap()
    return values.tolist()


class EntryCodec:
    """Encodes and decodes entries. Not thread-safe: the stores use it under their lock."""

    def __init__(self, compression_level: int = 3) -> None:
        self._compressor = zstandard.ZstdCompressor(
            level=compression_level, write_checksum=False, write_dict_id=False
        )
        self._decompressor = zstandard.ZstdDecompressor()
        self._encoder = msgspec.msgpack.Encoder()
        self._head_decoder = msgspec.msgpack.Decoder(_StoredHead | _StoredTombstone)
        self._record_decoder = msgspec.msgpack.Decoder(_StoredRecord)
        self._body_decoder = msgspec.msgpack.Decoder(_Body)

    def encode_record(self, record: TraceRecord, snapshot: list[int] | None = None) -> bytes:
        """The entry for ``record``; ``snapshot`` is its full prompt, when one is kept."""
        logprobs, logprob_bytes = pack_floats(record.logprobs)
        body = _Body(
            prompt_delta=pack_ids(record.prompt_delta_token_ids),
            completion=pack_ids(record.completion_token_ids),
            logprobs=logprobs,
            logprob_bytes=logprob_bytes,
            finish_reason=record.finish_reason,
            weight_version=record.weight_version,
            model=record.model,
            messages_delta=record.messages_delta,
            reset_reason=record.reset_reason,
            created_at=record.created_at,
            latency_s=record.latency_s,
            snapshot=None if snapshot is None else pack_ids(snapshot),
        )
        return self._encoder.encode(
            _StoredRecord(
                session_id=_compact_id(record.session_id),
                trace_id=_compact_id(record.trace_id),
                parent_trace_id=_compact_id(record.parent_trace_id),
                lineage_id=record.lineage_id,
                turn=record.turn,
                has_snapshot=snapshot is not None,
                body=self._compressor.compress(self._encoder.encode(body)),
            )
        )

    def encode_tombstone(self, session_id: str) -> bytes:
        return self._encoder.encode(_StoredTombstone(session_id=_compact_id(session_id)))

    def decode_head(self, payload: bytes) -> RecordHead | Tombstone:
        """The kind and index fields of an entry, without decompressing its body. Raises
        ``msgspec.DecodeError`` or ``ValueError`` for bytes that are not an entry."""
        stored = self._head_decoder.decode(payload)
        if isinstance(stored, _StoredTombstone):
            return Tombstone(session_id=_expand_id(stored.session_id))
        return RecordHead(
            session_id=_expand_id(stored.session_id),
            trace_id=_expand_id(stored.trace_id),
            parent_trace_id=_expand_id(stored.parent_trace_id, optional=True),
            lineage_id=stored.lineage_id,
            turn=stored.turn,
            has_snapshot=stored.has_snapshot,
        )

    def decode_record(self, payload: bytes) -> tuple[TraceRecord, bytes | None]:
        """The record an entry holds, and its snapshot still packed (``None`` when it has
        none; :func:`unpack_ids` unpacks it), since most reads never need it. Raises
        ``msgspec.DecodeError``, ``zstandard.ZstdError`` or ``ValueError`` for damaged bytes."""
        stored = self._record_decoder.decode(payload)
        body = self._body_decoder.decode(self._decompressor.decompress(stored.body))
        record = TraceRecord(
            trace_id=_expand_id(stored.trace_id),
            session_id=_expand_id(stored.session_id),
            lineage_id=stored.lineage_id,
            turn=stored.turn,
            parent_trace_id=_expand_id(stored.parent_trace_id, optional=True),
            prompt_delta_token_ids=unpack_ids(body.prompt_delta),
            completion_token_ids=unpack_ids(body.completion),
            logprobs=unpack_floats(body.logprobs, body.logprob_bytes),
            finish_reason=body.finish_reason,
            weight_version=body.weight_version,
            model=body.model,
            messages_delta=body.messages_delta,
            reset_reason=body.reset_reason,
            created_at=body.created_at,
            latency_s=body.latency_s,
        )
        return record, body.snapshot
