"""The entry format: heads coded against their segment's table and readable without the body,
lossless logprobs split between the compressed body and raw mantissa planes, compression
against a context only where it pays, and clear errors for bytes the format cannot hold."""

from __future__ import annotations

import math
import random
import struct

import msgspec
import pytest
import zstandard
from rllm_core.types import Message, TraceRecord
from rllm_trace_store_deltachain.codec import (
    EntryCodec,
    RecordHead,
    SegmentTable,
    Tombstone,
    _raw_frame,
)
from rllm_trace_store_deltachain.packing import pack_ids, unpack_ids

_replace = msgspec.structs.replace


def _bits(values):
    return [struct.pack("<d", v) for v in values]


def _record(**changes) -> TraceRecord:
    base = TraceRecord(
        trace_id="t-1",
        session_id="s",
        lineage_id="sub",
        turn=3,
        parent_trace_id="t-0",
        prompt_delta_token_ids=[5, 6, 70_000],
        completion_token_ids=[8, 9],
        logprobs=[-0.5, -0.25],
        finish_reason="length",
        weight_version=7,
        model="policy",
        messages_delta=(
            Message(role="user", content="héllo ✓"),
            Message(role="assistant", content="", reasoning="hm"),
        ),
        reset_reason="prefix_changed",
        created_at=1.7e9 + 1 / 3,
        latency_s=0.125,
    )
    return _replace(base, **changes)


def _head(record: TraceRecord, *, snapshot=False, context=False) -> RecordHead:
    return RecordHead(
        session_id=record.session_id,
        trace_id=record.trace_id,
        parent_trace_id=record.parent_trace_id,
        lineage_id=record.lineage_id,
        turn=record.turn,
        has_snapshot=snapshot,
        has_context=context,
    )


def _write(codec: EntryCodec, table: SegmentTable, record: TraceRecord, **options) -> bytes:
    """Encode ``record`` as the next entry of the segment ``table`` describes."""
    payload = codec.encode_record(record, table, **options).entry
    table.note(record.session_id, record.lineage_id, record.trace_id)
    return payload


def _body(payload: bytes) -> list:
    """The decompressed body array of a record entry."""
    entry = msgspec.msgpack.decode(payload)
    frame = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)
    return msgspec.msgpack.decode(frame.decompress(entry[6]))


def test_record_round_trips_exactly():
    codec = EntryCodec()
    record = _record()
    payload, tokens, has_context = codec.encode_record(record, SegmentTable())
    assert unpack_ids(tokens) == [5, 6, 70_000, 8, 9]
    assert not has_context
    decoded = codec.decode_record(payload, _head(record))
    assert decoded.record == record
    assert _bits(decoded.record.logprobs) == _bits(record.logprobs)
    assert decoded.tokens == tokens
    assert decoded.snapshot is None


def test_heads_name_a_stream_once_per_segment_and_elide_the_usual_parent():
    codec, writer = EntryCodec(), SegmentTable()
    first = _record(trace_id="a0", lineage_id="main", turn=0, parent_trace_id=None)
    second = _record(trace_id="a1", lineage_id="main", turn=1, parent_trace_id="a0")
    other = _record(trace_id="b0", lineage_id="sub", turn=0, parent_trace_id=None)
    fork = _record(trace_id="a1x", lineage_id="main", turn=1, parent_trace_id="a0")
    reset = _record(trace_id="a2", lineage_id="main", turn=2, parent_trace_id=None)
    payloads = [
        _write(codec, writer, record, snapshot=pack_ids([1, 2]) if record is fork else None)
        for record in (first, second, other, fork, reset)
    ]
    heads = [msgspec.msgpack.decode(payload)[:6] for payload in payloads]
    # hex-digit ids ("a0", "b0") are stored as bytes; "a1x" is not hex
    assert heads == [
        [0, ["s", "main"], b"\xa0", None, 0, 0],
        [0, 0, b"\xa1", True, 1, 0],
        [0, ["s", "sub"], b"\xb0", None, 0, 0],
        [0, 0, "a1x", b"\xa0", 1, 1],  # a fork: its parent is not the last record of stream 0
        [0, 0, b"\xa2", None, 2, 0],
    ]
    reader = SegmentTable()
    decoded = [codec.decode_head(payload, reader) for payload in payloads]
    assert decoded == [
        _head(first),
        _head(second),
        _head(other),
        _head(fork, snapshot=True),
        _head(reset),
    ]
    for payload, head, record in zip(
        payloads, decoded, (first, second, other, fork, reset), strict=True
    ):
        assert codec.decode_record(payload, head).record == record


def test_a_new_segment_names_its_streams_again():
    codec, table = EntryCodec(), SegmentTable()
    _write(codec, table, _record(trace_id="x0", parent_trace_id=None))
    again = _record(trace_id="x1", parent_trace_id="x0")
    assert msgspec.msgpack.decode(_write(codec, SegmentTable(), again))[1:4] == [
        ["s", "sub"],
        "x1",
        "x0",
    ]
    table.reset()
    assert msgspec.msgpack.decode(_write(codec, table, again))[1] == ["s", "sub"]


def test_a_head_coded_against_another_table_is_refused():
    codec = EntryCodec()
    table = SegmentTable()
    _write(codec, table, _record(trace_id="x0", parent_trace_id=None))
    payload = _write(codec, table, _record(trace_id="x1", parent_trace_id="x0"))
    with pytest.raises(ValueError, match="stream 0 was never opened in this segment"):
        codec.decode_head(payload, SegmentTable())


def test_tombstone():
    codec = EntryCodec()
    payload = codec.encode_tombstone("gone")
    assert msgspec.msgpack.decode(payload) == [1, "gone"]
    assert codec.decode_head(payload, SegmentTable()) == Tombstone(session_id="gone")


def test_float32_logprobs_keep_their_mantissa_planes_outside_the_compressed_body():
    codec = EntryCodec()
    exact = [-0.5, -0.0, -1.25, -3.0517578125e-05, 0.0]
    record = _record(completion_token_ids=[1] * 5, logprobs=exact)
    payload = codec.encode_record(record, SegmentTable()).entry
    entry = msgspec.msgpack.decode(payload)
    body = _body(payload)
    assert (body[2], body[3]) == (bytes([0xBF, 0x80, 0xBF, 0xB8, 0x00]), 4)
    assert len(entry[7]) == 3 * len(exact)
    decoded = codec.decode_record(payload, _head(record)).record
    assert _bits(decoded.logprobs) == _bits(exact)


@pytest.mark.parametrize(
    "values",
    [[-0.1], [-0.5, 1 / 3], [5e-324], [-1e300], [float("inf"), -2.5e-310], [math.nan, -0.5]],
)
def test_logprobs_that_float32_would_change_keep_every_bit(values):
    codec = EntryCodec()
    record = _record(completion_token_ids=[1] * len(values), logprobs=values)
    payload = codec.encode_record(record, SegmentTable()).entry
    body = _body(payload)
    assert body[3] == 8
    assert len(body[2]) == len(values)
    assert len(msgspec.msgpack.decode(payload)[7]) == 7 * len(values)
    decoded = codec.decode_record(payload, _head(record)).record
    assert _bits(decoded.logprobs) == _bits(values)


def test_compression_level_changes_bytes_not_content():
    record = _record(prompt_delta_token_ids=list(range(1000)) * 3)
    fast, small = EntryCodec(1), EntryCodec(19)
    for writer, reader in ((small, fast), (fast, small)):
        payload = writer.encode_record(record, SegmentTable()).entry
        assert reader.decode_record(payload, _head(record)).record == record


def test_a_snapshot_is_kept_packed():
    codec = EntryCodec()
    record = _record()
    payload = codec.encode_record(record, SegmentTable(), snapshot=pack_ids([1, 2, 3])).entry
    head = codec.decode_head(payload, SegmentTable())
    assert head.has_snapshot
    decoded = codec.decode_record(payload, head)
    assert decoded.snapshot is not None and unpack_ids(decoded.snapshot) == [1, 2, 3]
    assert decoded.record == record


def _text_like(rng: random.Random, count: int) -> list[int]:
    """Ids that repeat like text: phrases drawn from a small set."""
    phrases = [[rng.randrange(49_152) for _ in range(rng.randint(2, 9))] for _ in range(40)]
    ids: list[int] = []
    while len(ids) < count:
        ids.extend(rng.choice(phrases))
    return ids[:count]


def test_ids_that_repeat_their_context_are_compressed_against_it():
    rng = random.Random(1)
    ids = _text_like(rng, 2400)
    context, delta = pack_ids(ids[:2000]), ids[2000:]
    record = _record(prompt_delta_token_ids=delta, completion_token_ids=[], logprobs=[])
    codec = EntryCodec()
    alone = codec.encode_record(record, SegmentTable()).entry
    against, _, has_context = codec.encode_record(record, SegmentTable(), context=context)
    head = codec.decode_head(against, SegmentTable())
    assert has_context and head.has_context
    assert len(against) < 0.8 * len(alone)
    assert codec.decode_record(against, head, context).record == record
    with pytest.raises(ValueError, match="compressed against the tokens before it"):
        codec.decode_record(against, head)


@pytest.mark.parametrize("size", [0, 1, 16_384, 128 * 1024, 300_001])
def test_a_context_is_handed_to_zstd_as_a_frame_of_raw_blocks(size):
    content = random.Random(size).randbytes(size)
    frame = _raw_frame(content)
    assert zstandard.ZstdDecompressor().decompress(frame) == content
    blocks = max(1, -(-size // (128 * 1024)))
    assert len(frame) == 4 + 1 + 4 + 3 * blocks + size


def test_a_context_that_saves_nothing_is_not_used():
    # ids that look like noise in all four bytes: nothing to find, in the context or not
    rng = random.Random(2)
    context = pack_ids([rng.randrange(-(2**31), 2**31) for _ in range(2000)])
    record = _record(
        prompt_delta_token_ids=[rng.randrange(-(2**31), 2**31) for _ in range(400)],
        completion_token_ids=[],
        logprobs=[],
    )
    codec = EntryCodec()
    payload, _, has_context = codec.encode_record(record, SegmentTable(), context=context)
    head = codec.decode_head(payload, SegmentTable())
    assert not has_context and not head.has_context
    assert codec.decode_record(payload, head).record == record


@pytest.mark.parametrize(
    ("trace_id", "stored"),
    [
        ("00ff", b"\x00\xff"),
        ("9f86d081884c7d659a2feaa0c55ad015", bytes.fromhex("9f86d081884c7d659a2feaa0c55ad015")),
        ("ABCD", "ABCD"),
        ("abc", "abc"),
        ("", ""),
        ("t-1", "t-1"),
    ],
)
def test_hex_ids_are_stored_as_bytes_and_read_back_as_text(trace_id, stored):
    codec = EntryCodec()
    record = _record(trace_id=trace_id, session_id=trace_id, parent_trace_id=trace_id)
    payload = codec.encode_record(record, SegmentTable()).entry
    assert msgspec.msgpack.decode(payload)[1:4] == [[stored, "sub"], stored, stored]
    head = codec.decode_head(payload, SegmentTable())
    assert (head.session_id, head.trace_id, head.parent_trace_id) == (trace_id,) * 3
    assert codec.decode_record(payload, head).record == record
    tombstone = codec.encode_tombstone(trace_id)
    assert msgspec.msgpack.decode(tombstone) == [1, stored]
    assert codec.decode_head(tombstone, SegmentTable()) == Tombstone(session_id=trace_id)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ([0, [5, "main"], "t", None, 0, 0], "an id must be text or bytes, found int"),
        ([0, ["s", "main"], "t", True, 0, 0], "an id must be text or bytes, found bool"),
        ([0, "s", "t", None, 0, 0], "a stream is a number or"),
        ([0, 3, "t", None, 0, 0], "stream 3 was never opened"),
    ],
)
def test_a_malformed_head_is_refused(head, message):
    payload = msgspec.msgpack.encode([*head, b"", b""])
    with pytest.raises(ValueError, match=message):
        EntryCodec().decode_head(payload, SegmentTable())
