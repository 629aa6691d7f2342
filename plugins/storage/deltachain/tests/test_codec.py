"""The entry format: packed and transposed arrays, lossless logprobs, heads readable without
the body, and clear errors for values the format cannot hold."""

from __future__ import annotations

import math
import struct

import msgspec
import pytest
import zstandard
from rllm_core.types import Message, TraceRecord
from rllm_storage_deltachain.codec import EntryCodec, RecordHead, Tombstone, pack_ids, unpack_ids


def _bits(values):
    return [struct.pack("<d", v) for v in values]


def test_ids_are_int32_little_endian_byte_planes():
    # 1 = 01 00 00 00 and 258 = 02 01 00 00; the planes hold byte 0 of each, then byte 1, ...
    assert pack_ids([1, 258]) == b"\x01\x02\x00\x01\x00\x00\x00\x00"
    assert pack_ids([-1]) == b"\xff\xff\xff\xff"
    assert pack_ids([]) == b""


@pytest.mark.parametrize(
    "ids", [[], [0], [2**31 - 1, -(2**31), 0, 151_643, 7], list(range(0, 300_000, 997))]
)
def test_ids_round_trip(ids):
    assert unpack_ids(pack_ids(ids)) == ids


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 10**12])
def test_ids_outside_int32_name_the_value(bad):
    with pytest.raises(ValueError, match=str(bad)):
        pack_ids([1, bad, 2])


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
    return msgspec.structs.replace(base, **changes)


def _body(payload: bytes) -> list:
    """The decompressed body array of a record entry."""
    entry = msgspec.msgpack.decode(payload)
    return msgspec.msgpack.decode(zstandard.ZstdDecompressor().decompress(entry[-1]))


def test_record_round_trips_exactly():
    codec = EntryCodec()
    record = _record()
    decoded, snapshot = codec.decode_record(codec.encode_record(record))
    assert decoded == record
    assert snapshot is None
    assert _bits(decoded.logprobs) == _bits(record.logprobs)


def test_head_is_plain_msgpack_before_the_compressed_body():
    codec = EntryCodec()
    payload = codec.encode_record(_record(), snapshot=[1, 2, 3])
    entry = msgspec.msgpack.decode(payload)
    assert entry[:7] == ["r", "s", "t-1", "t-0", "sub", 3, True]
    assert codec.decode_head(payload) == RecordHead(
        session_id="s",
        trace_id="t-1",
        parent_trace_id="t-0",
        lineage_id="sub",
        turn=3,
        has_snapshot=True,
    )
    decoded, snapshot = codec.decode_record(payload)
    assert snapshot is not None and unpack_ids(snapshot) == [1, 2, 3]
    assert decoded == _record()


def test_tombstone():
    codec = EntryCodec()
    payload = codec.encode_tombstone("gone")
    assert msgspec.msgpack.decode(payload) == ["d", "gone"]
    assert codec.decode_head(payload) == Tombstone(session_id="gone")


def test_float32_logprobs_are_stored_in_four_bytes():
    codec = EntryCodec()
    exact = [-0.5, -0.0, -1.25, -3.0517578125e-05, 0.0]
    body = _body(codec.encode_record(_record(completion_token_ids=[1] * 5, logprobs=exact)))
    assert body[3] == 4
    assert len(body[2]) == 4 * len(exact)
    decoded, _ = codec.decode_record(codec.encode_record(_record(logprobs=exact)))
    assert _bits(decoded.logprobs) == _bits(exact)


@pytest.mark.parametrize(
    "values",
    [[-0.1], [-0.5, 1 / 3], [5e-324], [-1e300], [float("inf"), -2.5e-310], [math.nan, -0.5]],
)
def test_logprobs_that_float32_would_change_keep_every_bit(values):
    codec = EntryCodec()
    payload = codec.encode_record(_record(logprobs=values))
    body = _body(payload)
    assert body[3] == 8
    assert len(body[2]) == 8 * len(values)
    decoded, _ = codec.decode_record(payload)
    assert _bits(decoded.logprobs) == _bits(values)


def test_compression_level_changes_bytes_not_content():
    record = _record(prompt_delta_token_ids=list(range(1000)) * 3)
    fast, small = EntryCodec(1), EntryCodec(19)
    assert fast.decode_record(small.encode_record(record))[0] == record
    assert small.decode_record(fast.encode_record(record))[0] == record


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
    payload = codec.encode_record(record)
    assert msgspec.msgpack.decode(payload)[1:4] == [stored, stored, stored]
    assert codec.decode_record(payload)[0] == record
    head = codec.decode_head(payload)
    assert (head.session_id, head.trace_id, head.parent_trace_id) == (trace_id,) * 3
    tombstone = codec.encode_tombstone(trace_id)
    assert msgspec.msgpack.decode(tombstone) == ["d", stored]
    assert codec.decode_head(tombstone) == Tombstone(session_id=trace_id)


def test_a_head_with_an_id_of_the_wrong_type_is_refused():
    payload = msgspec.msgpack.encode(["r", 5, "t", None, "main", 0, False, b""])
    with pytest.raises(ValueError, match="an id must be text or bytes, found int"):
        EntryCodec().decode_head(payload)
