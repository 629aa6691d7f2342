"""Segment files: a torn tail is cut on open and every complete record survives, records
acknowledged before a kill -9 survive, damage in the middle is refused, segments rotate by
size, and one process holds a directory at a time."""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
import textwrap

import msgspec
import pytest
from rllm_core.errors import StorageError
from rllm_core.storage.framing import CorruptLogError
from rllm_core.testing.suites.storage import expected_prompts, make_trace_chain, run_until_killed
from rllm_trace_store_deltachain.segments import MAGIC
from rllm_trace_store_deltachain.store import DeltaChainTraceStore


def _segments(path):
    return sorted(p for p in path.iterdir() if p.name.startswith("segment-"))


def _frame_spans(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of every frame in a segment's bytes."""
    spans, offset = [], len(MAGIC)
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        spans.append((offset, offset + 8 + length))
        offset += 8 + length
    return spans


def _write(path, records, **options):
    with DeltaChainTraceStore(path, **options) as store:
        for record in records:
            store.append(record)


def test_segment_layout(tmp_path):
    records = make_trace_chain("s", 3, seed=1)
    _write(tmp_path / "t", records)
    (segment,) = _segments(tmp_path / "t")
    assert segment.name == "segment-00000000.log"
    data = segment.read_bytes()
    assert data[:8] == b"RLLMDCT2"
    spans = _frame_spans(data)
    assert len(spans) == 3
    assert spans[-1][1] == len(data)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["lock", segment.name]


def test_torn_tail_is_cut_at_every_length_and_complete_records_survive(tmp_path, caplog):
    records = make_trace_chain("s", 4, seed=2)
    original = tmp_path / "original"
    _write(original, records)
    (segment,) = _segments(original)
    data = segment.read_bytes()
    last_start, last_end = _frame_spans(data)[-1]
    truth = expected_prompts(records[:3])
    for cut in range(last_start + 1, last_end):
        copy = tmp_path / f"cut-{cut}"
        shutil.copytree(original, copy)
        with open(copy / segment.name, "r+b") as handle:
            handle.truncate(cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING), DeltaChainTraceStore(copy) as store:
            assert store.chain("s") == records[:3], f"cut at byte {cut}"
            traces = store.session("s")
            assert [t.prompt_token_ids for t in traces] == [truth[r.trace_id] for r in records[:3]]
            assert f"cutting {cut - last_start} bytes" in caplog.text
            # the tail is gone from the file, so the next record follows the last intact one
            assert (copy / segment.name).stat().st_size == last_start
            store.append(records[3])
        with DeltaChainTraceStore(copy) as store:
            assert store.chain("s") == records
        shutil.rmtree(copy)


def test_torn_tail_with_a_corrupted_checksum_is_cut(tmp_path):
    records = make_trace_chain("s", 3, seed=3)
    _write(tmp_path / "t", records)
    (segment,) = _segments(tmp_path / "t")
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    with DeltaChainTraceStore(tmp_path / "t") as store:
        assert store.chain("s") == records[:2]


def test_damage_before_the_end_is_refused_with_the_offset(tmp_path):
    records = make_trace_chain("s", 3, seed=4)
    _write(tmp_path / "t", records)
    (segment,) = _segments(tmp_path / "t")
    data = bytearray(segment.read_bytes())
    start, end = _frame_spans(bytes(data))[1]
    data[end - 1] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=f"record at byte {start} fails its checksum"):
        DeltaChainTraceStore(tmp_path / "t")
    # the failed open released the directory
    data[end - 1] ^= 0xFF
    segment.write_bytes(bytes(data))
    with DeltaChainTraceStore(tmp_path / "t") as store:
        assert store.chain("s") == records


def test_a_segment_cut_inside_its_header_starts_again(tmp_path):
    path = tmp_path / "t"
    path.mkdir()
    (path / "segment-00000000.log").write_bytes(MAGIC[:3])
    with DeltaChainTraceStore(path) as store:
        record = make_trace_chain("s", 1)[0]
        store.append(record)
    with DeltaChainTraceStore(path) as store:
        assert store.chain("s") == [record]


def test_a_foreign_file_is_refused(tmp_path):
    path = tmp_path / "t"
    path.mkdir()
    (path / "segment-00000000.log").write_bytes(b"not a trace segment")
    with pytest.raises(StorageError, match="is not a delta-chain segment"):
        DeltaChainTraceStore(path)


def test_a_segment_of_the_first_format_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "t"
    path.mkdir()
    (path / "segment-00000000.log").write_bytes(b"RLLMDCT1")
    with pytest.raises(StorageError, match="holds traces in format 1"):
        DeltaChainTraceStore(path)


def test_an_empty_segment_after_a_full_one_starts_a_fresh_table(tmp_path):
    # A crash right after a segment was created leaves it with its header only; the records
    # appended to it must not be coded against the streams of the segment before it.
    path = tmp_path / "t"
    records = make_trace_chain("s", 6, seed=11)
    _write(path, records[:3])
    (path / "segment-00000001.log").write_bytes(MAGIC)
    _write(path, records[3:])
    assert [p.stat().st_size > len(MAGIC) for p in _segments(path)] == [True, True]
    with DeltaChainTraceStore(path) as store:
        assert store.chain("s") == records
        truth = expected_prompts(records)
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in records
        ]


def test_an_intact_frame_that_is_not_an_entry_is_refused(tmp_path):
    from rllm_core.storage.framing import encode_frame

    path = tmp_path / "t"
    path.mkdir()
    (path / "segment-00000000.log").write_bytes(MAGIC + encode_frame(b"\xc1garbage"))
    with pytest.raises(StorageError, match="not a trace-store entry"):
        DeltaChainTraceStore(path)


def test_segments_rotate_by_size_and_read_back_across_files(tmp_path):
    records = make_trace_chain("s", 40, seed=5) + make_trace_chain("t", 25, seed=6)
    path = tmp_path / "t"
    with DeltaChainTraceStore(path, segment_bytes=4096) as store:
        for record in records:
            store.append(record)
        assert store.chain("s") == records[:40]
        total = store.size_on_disk()
    segments = _segments(path)
    assert [p.name for p in segments] == [f"segment-{i:08d}.log" for i in range(len(segments))]
    assert len(segments) >= 3
    assert total == sum(p.stat().st_size for p in segments)
    frames = 0
    for segment in segments:
        data = segment.read_bytes()
        assert data[:8] == MAGIC
        assert len(data) <= 4096
        frames += len(_frame_spans(data))
    assert frames == len(records)
    with DeltaChainTraceStore(path, segment_bytes=4096) as store:
        truth = expected_prompts(records)
        assert store.chain("s") == records[:40]
        assert store.chain("t") == records[40:]
        for trace in store.session("s") + store.session("t"):
            assert trace.prompt_token_ids == truth[trace.record.trace_id]


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    rng = random.Random(7)
    noise = [rng.randrange(150_000) for _ in range(5000)]
    big = msgspec.structs.replace(make_trace_chain("s", 1, seed=7)[0], prompt_delta_token_ids=noise)
    small = make_trace_chain("s", 1, parent=big, seed=8)[0]
    path = tmp_path / "t"
    _write(path, [small, big], segment_bytes=4096)
    sizes = [p.stat().st_size for p in _segments(path)]
    assert len(sizes) == 2 and sizes[1] > 4096
    with DeltaChainTraceStore(path, segment_bytes=4096) as store:
        assert store.session("s")[1].prompt_token_ids == (
            noise + big.completion_token_ids + small.prompt_delta_token_ids
        )


def test_one_instance_per_directory(tmp_path):
    with (
        DeltaChainTraceStore(tmp_path / "t"),
        pytest.raises(StorageError, match="already open"),
    ):
        DeltaChainTraceStore(tmp_path / "t")
    DeltaChainTraceStore(tmp_path / "t").close()


_KILL_DRIVER = textwrap.dedent(
    """
    import sys
    from rllm_core.testing.suites.storage import make_trace_chain
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    store = DeltaChainTraceStore(sys.argv[1], segment_bytes=4096, snapshot_every=5)
    records = make_trace_chain("killed", 10_000, seed=9)
    for index, record in enumerate(records):
        store.append(record)
        print("ack", index, flush=True)
    """
)


def test_acknowledged_records_survive_kill_9(tmp_path):
    location = tmp_path / "t"
    lines = run_until_killed(_KILL_DRIVER, str(location), acks=150)
    acked = max(int(line.split()[1]) for line in lines if line.startswith("ack"))
    records = make_trace_chain("killed", 10_000, seed=9)
    with DeltaChainTraceStore(location, segment_bytes=4096, snapshot_every=5) as store:
        chain = store.chain("killed")
        assert len(chain) > acked
        assert chain == records[: len(chain)]
        truth = expected_prompts(records[: len(chain)])
        traces = store.session("killed")
        assert all(t.chain_complete for t in traces)
        assert [t.prompt_token_ids for t in traces] == [truth[r.trace_id] for r in chain]
        last = store.trace("killed", chain[-1].trace_id)
        assert last is not None and last.prompt_token_ids == truth[chain[-1].trace_id]
        store.append(records[len(chain)])
    assert os.path.isdir(location)
