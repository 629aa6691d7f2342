"""The bytes of one stored entry: a trace record (with an optional snapshot) or a tombstone.

An entry is a msgpack array whose first element names its kind:

- ``[0, stream, trace_id, parent, turn, flags, body, logprob_low]``: a record.
- ``[1, session_id]``: a tombstone; the session's earlier records are deleted.

The head of a record (everything before ``body``) is plain msgpack, so opening a store indexes
it without decompressing anything. It is coded against the :class:`SegmentTable` of its segment,
which the heads before it in the same segment build up:

- ``stream`` names the record's session and lineage: ``[session_id, lineage_id]`` the first
  time that pair appears in the segment, afterwards the pair's number (0, 1, ... in order of
  first appearance), one byte for the first 128 pairs.
- ``parent`` is ``None`` for a root, ``true`` when the parent is the last record written before
  it in the same stream and segment (the usual next turn), else the parent's id.
- ``flags``: bit 0 set when ``body`` holds a snapshot (the full prompt), bit 1 when the token
  ids were compressed against the conversation before them
  (:mod:`rllm_trace_store_deltachain.context`).

An id made of lowercase hex digit pairs (a ``uuid4().hex`` id) is stored as the msgpack binary
of its bytes, half the size of the text; any other id is stored as text.

``body`` is one zstd frame without the magic number (zstd's ``magicless`` format) holding the
msgpack array :class:`_Body`: the prompt delta and completion as one packed id array
(:func:`~rllm_trace_store_deltachain.packing.pack_ids`), the plane of logprob signs and exponents,
and the remaining fields. With flag bit 1 the frame was compressed with the record's context,
packed the same way, as a raw-content dictionary. ``logprob_low`` holds the other logprob
planes (mantissa bits) as they are: they do not compress, and outside the frame they do not
spoil zstd's statistics for the rest.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import msgspec
import zstandard
from rllm_core.types import Message, TraceRecord

from rllm_trace_store_deltachain.packing import pack_floats, pack_ids, unpack_floats, unpack_ids

__all__ = ["Decoded", "Encoded", "EntryCodec", "RecordHead", "SegmentTable", "Tombstone"]

_RECORD, _TOMBSTONE = 0, 1
_SNAPSHOT, _CONTEXT = 1, 2
_FORMAT = zstandard.FORMAT_ZSTD1_MAGICLESS
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MAX_BLOCK = 128 * 1024
_HEX_PAIRS = re.compile(r"(?:[0-9a-f]{2})+")


class RecordHead(msgspec.Struct, frozen=True):
    """What opening a store keeps in its index about a record."""

    session_id: str
    trace_id: str
    parent_trace_id: str | None
    lineage_id: str
    turn: int
    has_snapshot: bool
    has_context: bool


class Tombstone(msgspec.Struct, frozen=True):
    """Deletes every earlier record of ``session_id``."""

    session_id: str


class Encoded(NamedTuple):
    """An encoded record: the entry, the record's ids packed (its prompt delta, then its
    completion), and whether they were compressed against the context."""

    entry: bytes
    tokens: bytes
    has_context: bool


class Decoded(msgspec.Struct, frozen=True):
    """A decoded record, with its token ids also as they were packed (the prompt delta, then
    the completion) and its snapshot still packed (``None`` when it has none), since most reads
    never need it; :func:`~rllm_trace_store_deltachain.packing.unpack_ids` unpacks both."""

    record: TraceRecord
    tokens: bytes
    snapshot: bytes | None


class SegmentTable:
    """What the record heads of one segment are coded against: the streams (session and lineage
    pairs) opened so far in the segment, and the last trace id written to each.

    The writer and every reader build the same table by going through the segment's heads in
    order; a new segment starts with an empty one (:meth:`reset`).
    """

    def __init__(self) -> None:
        self._numbers: dict[tuple[str, str], int] = {}
        self._streams: list[tuple[str, str]] = []
        self._last: list[str] = []

    def reset(self) -> None:
        self._numbers.clear()
        self._streams.clear()
        self._last.clear()

    def code(self, session_id: str, lineage_id: str, parent: str | None) -> tuple[Any, Any]:
        """The ``stream`` and ``parent`` fields of a record's head; changes nothing."""
        number = self._numbers.get((session_id, lineage_id))
        if number is None:
            return [_compact_id(session_id), lineage_id], _compact_id(parent)
        if parent is not None and parent == self._last[number]:
            return number, True
        return number, _compact_id(parent)

    def resolve(self, stream: Any, parent: Any) -> tuple[str, str, str | None]:
        """Session id, lineage id and parent id from the fields :meth:`code` made; raises
        ``ValueError`` for fields this table cannot have made."""
        if isinstance(stream, int) and not isinstance(stream, bool):
            if not 0 <= stream < len(self._streams):
                raise ValueError(f"stream {stream} was never opened in this segment")
            session_id, lineage_id = self._streams[stream]
            if parent is True:
                return session_id, lineage_id, self._last[stream]
        elif isinstance(stream, list) and len(stream) == 2 and isinstance(stream[1], str):
            session_id, lineage_id = _expand_id(stream[0]), stream[1]
        else:
            raise ValueError(f"a stream is a number or [session, lineage], found {stream!r}")
        return session_id, lineage_id, _expand_id(parent, optional=True)

    def note(self, session_id: str, lineage_id: str, trace_id: str) -> None:
        """Record that ``trace_id`` was written to the stream; opens the stream when new."""
        key = (session_id, lineage_id)
        number = self._numbers.get(key)
        if number is None:
            self._numbers[key] = len(self._streams)
            self._streams.append(key)
            self._last.append(trace_id)
        else:
            self._last[number] = trace_id


class _StoredHead(msgspec.Struct, array_like=True, tag=_RECORD):
    stream: Any
    trace_id: Any
    parent: Any
    turn: int
    flags: int


class _StoredRecord(_StoredHead, tag=_RECORD):
    body: bytes
    logprob_low: bytes


class _StoredTombstone(msgspec.Struct, array_like=True, tag=_TOMBSTONE):
    session_id: Any


class _Body(msgspec.Struct, array_like=True):
    tokens: bytes
    delta_count: int
    logprob_high: bytes
    logprob_width: int
    finish_reason: str
    weight_version: int
    model: str
    messages_delta: tuple[Message, ...]
    reset_reason: str | None
    created_at: float
    latency_s: float
    snapshot: bytes | None
    flags: tuple[str, ...] = ()


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


def _raw_frame(content: bytes) -> bytes:
    """A zstd frame (RFC 8878) that stores ``content`` as it is, in raw blocks."""
    # Frame header: single segment, 4-byte content size, no checksum, no dictionary id.
    parts = [_ZSTD_MAGIC, b"\xa0", len(content).to_bytes(4, "little")]
    blocks = [content[i : i + _MAX_BLOCK] for i in range(0, len(content), _MAX_BLOCK)] or [b""]
    for index, block in enumerate(blocks):
        # Block header: size, then type 0 (raw), then whether it is the last block.
        last = index == len(blocks) - 1
        parts.append(((len(block) << 3) | last).to_bytes(3, "little"))
        parts.append(block)
    return b"".join(parts)


class EntryCodec:
    """Encodes and decodes entries. Not thread-safe: the stores use it under their lock."""

    def __init__(self, compression_level: int = 3) -> None:
        self.compression_level = compression_level
        self._compressor = zstandard.ZstdCompressor(
            level=compression_level, write_checksum=False, write_dict_id=False
        )
        self._decompressor = zstandard.ZstdDecompressor(format=_FORMAT)
        self._chain_decompressor = zstandard.ZstdDecompressor()
        self._encoder = msgspec.msgpack.Encoder()
        self._head_decoder = msgspec.msgpack.Decoder(_StoredHead | _StoredTombstone)
        self._record_decoder = msgspec.msgpack.Decoder(_StoredRecord)
        self._body_decoder = msgspec.msgpack.Decoder(_Body)

    # ---------------------------------------------------------------- writing

    def encode_record(
        self,
        record: TraceRecord,
        table: SegmentTable,
        *,
        snapshot: bytes | None = None,
        context: bytes | None = None,
    ) -> Encoded:
        """``record`` encoded as the next entry of the segment ``table`` describes (the table
        is not changed: call :meth:`SegmentTable.note` once the entry is written).
        ``snapshot`` is its full prompt, packed, when one is kept; ``context`` the packed ids
        to compress against when that comes out smaller."""
        logprobs, width = pack_floats(record.logprobs)
        split = len(logprobs) - len(record.logprobs)
        tokens = pack_ids(record.prompt_delta_token_ids + record.completion_token_ids)
        body = _Body(
            tokens=tokens,
            delta_count=len(record.prompt_delta_token_ids),
            logprob_high=logprobs[split:],
            logprob_width=width,
            finish_reason=record.finish_reason,
            weight_version=record.weight_version,
            model=record.model,
            messages_delta=record.messages_delta,
            reset_reason=record.reset_reason,
            created_at=record.created_at,
            latency_s=record.latency_s,
            snapshot=snapshot,
            flags=record.flags,
        )
        stream, parent = table.code(record.session_id, record.lineage_id, record.parent_trace_id)
        compressed, used_context = self._compress(self._encoder.encode(body), context)
        flags = (_SNAPSHOT if snapshot is not None else 0) | (_CONTEXT if used_context else 0)
        entry = self._encoder.encode(
            _StoredRecord(
                stream=stream,
                trace_id=_compact_id(record.trace_id),
                parent=parent,
                turn=record.turn,
                flags=flags,
                body=compressed,
                logprob_low=logprobs[:split],
            )
        )
        return Encoded(entry, tokens, used_context)

    def encode_tombstone(self, session_id: str) -> bytes:
        return self._encoder.encode(_StoredTombstone(session_id=_compact_id(session_id)))

    def _compress(self, data: bytes, context: bytes | None) -> tuple[bytes, bool]:
        """``data`` compressed alone, or against ``context`` when that comes out smaller; the
        frame and whether it used the context."""
        # The magicless format is the standard frame without its first 4 bytes; compressing
        # with a level (not explicit parameters) lets zstd size its parameters to the input.
        alone = self._compressor.compress(data)[len(_ZSTD_MAGIC) :]
        if not context:
            return alone, False
        dictionary = zstandard.ZstdCompressionDict(
            context, dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )
        compressor = zstandard.ZstdCompressor(
            level=self.compression_level,
            dict_data=dictionary,
            write_checksum=False,
            write_dict_id=False,
        )
        against = compressor.compress(data)[len(_ZSTD_MAGIC) :]
        if len(against) < len(alone):
            return against, True
        return alone, False

    # ---------------------------------------------------------------- reading

    def decode_head(self, payload: bytes, table: SegmentTable) -> RecordHead | Tombstone:
        """The kind and index fields of the next entry of the segment ``table`` describes,
        without decompressing its body; notes a record in ``table``. Raises
        ``msgspec.DecodeError`` or ``ValueError`` for bytes that are not an entry."""
        stored = self._head_decoder.decode(payload)
        if isinstance(stored, _StoredTombstone):
            return Tombstone(session_id=_expand_id(stored.session_id))
        session_id, lineage_id, parent = table.resolve(stored.stream, stored.parent)
        trace_id = _expand_id(stored.trace_id)
        table.note(session_id, lineage_id, trace_id)
        return RecordHead(
            session_id=session_id,
            trace_id=trace_id,
            parent_trace_id=parent,
            lineage_id=lineage_id,
            turn=stored.turn,
            has_snapshot=bool(stored.flags & _SNAPSHOT),
            has_context=bool(stored.flags & _CONTEXT),
        )

    def decode_record(
        self, payload: bytes, head: RecordHead, context: bytes | None = None
    ) -> Decoded:
        """The record an entry holds, given its decoded ``head`` and, when
        ``head.has_context``, the same packed context it was written with. Raises
        ``msgspec.DecodeError``, ``zstandard.ZstdError`` or ``ValueError`` for damaged bytes."""
        stored = self._record_decoder.decode(payload)
        if head.has_context:
            if context is None:
                raise ValueError(
                    f"trace {head.trace_id} was compressed against the tokens before it, which"
                    " are not available"
                )
            # A content-dictionary chain decodes its second frame with the first frame's
            # content as a raw-content dictionary, on a decompressor built once; a decompressor
            # built per record with a dictionary costs several times more.
            data = self._chain_decompressor.decompress_content_dict_chain(
                [_raw_frame(context), _ZSTD_MAGIC + stored.body]
            )
        else:
            data = self._decompressor.decompress(stored.body)
        body = self._body_decoder.decode(data)
        tokens = unpack_ids(body.tokens)
        if not 0 <= body.delta_count <= len(tokens):
            raise ValueError(f"a prompt delta of {body.delta_count} of {len(tokens)} tokens")
        record = TraceRecord(
            trace_id=head.trace_id,
            session_id=head.session_id,
            lineage_id=head.lineage_id,
            turn=head.turn,
            parent_trace_id=head.parent_trace_id,
            prompt_delta_token_ids=tokens[: body.delta_count],
            completion_token_ids=tokens[body.delta_count :],
            logprobs=unpack_floats(stored.logprob_low + body.logprob_high, body.logprob_width),
            finish_reason=body.finish_reason,
            weight_version=body.weight_version,
            model=body.model,
            messages_delta=body.messages_delta,
            reset_reason=body.reset_reason,
            created_at=body.created_at,
            latency_s=body.latency_s,
            flags=body.flags,
        )
        return Decoded(record=record, tokens=body.tokens, snapshot=body.snapshot)
