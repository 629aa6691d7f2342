"""The ``file`` sample buffer: the conformance suite, the log format and recovery from damage."""

from __future__ import annotations

import errno
import os
import struct
import zlib

import msgspec
import pytest
from rllm_core.errors import StorageError
from rllm_core.storage import durable
from rllm_core.storage.framing import CorruptLogError
from rllm_core.testing.suites.storage import SampleBufferConformance, make_samples
from rllm_sample_buffer_file.buffer import MAGIC, FileSampleBuffer

FACTORY_SOURCE = """
from rllm_sample_buffer_file.buffer import FileSampleBuffer

def open_store(location):
    return FileSampleBuffer(location, fsync={fsync})
"""


class _Fixtures:
    fsync = True

    @pytest.fixture
    def opened(self):
        buffers: list[FileSampleBuffer] = []
        yield buffers
        for buffer in buffers:
            buffer.close()

    @pytest.fixture
    def sample_buffer(self, tmp_path, opened):
        buffer = FileSampleBuffer(tmp_path / "buffer", fsync=self.fsync)
        opened.append(buffer)
        return buffer

    @pytest.fixture
    def reopen(self, opened):
        def _reopen(buffer: FileSampleBuffer) -> FileSampleBuffer:
            buffer.close()
            fresh = FileSampleBuffer(buffer.path, fsync=buffer.fsync)
            opened.append(fresh)
            return fresh

        return _reopen

    @pytest.fixture
    def subprocess_factory_source(self):
        return FACTORY_SOURCE.format(fsync=self.fsync)


class TestFileSampleBuffer(_Fixtures, SampleBufferConformance):
    fsync = True


class TestFileSampleBufferWithoutFsync(_Fixtures, SampleBufferConformance):
    fsync = False


# --------------------------------------------------------------------------------------------
# Format
# --------------------------------------------------------------------------------------------


def _frames(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of every frame in a log's bytes."""
    spans, offset = [], len(MAGIC)
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        spans.append((offset, offset + 8 + length))
        offset += 8 + length
    return spans


def test_log_format(tmp_path):
    samples = make_samples(2, weight_version=[3, 4], seed=1)
    with FileSampleBuffer(tmp_path) as buffer:
        stored = buffer.append(samples)
    data = (tmp_path / "samples.log").read_bytes()
    assert data[:8] == b"RLLMSBL1"
    length, checksum = struct.unpack_from("<II", data, 8)
    payload = data[16:]
    assert len(payload) == length
    assert zlib.crc32(payload) == checksum
    decoded = msgspec.msgpack.decode(payload)
    assert decoded["first_sequence"] == 0
    assert decoded["versions"] == [3, 4]
    assert [s["sequence"] for s in decoded["samples"]] == [0, 1]
    assert decoded["samples"][1]["datum"]["token_ids"] == stored[1].datum.token_ids
    assert decoded["groups"] == ["g", "g"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "samples.log"]


def test_watermark_file_is_replaced_atomically(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer:
        buffer.append(make_samples(3))
        buffer.commit(1)
        assert (tmp_path / "committed").read_bytes() == b'{"watermark":1}\n'
        buffer.commit(2)
    assert (tmp_path / "committed").read_bytes() == b'{"watermark":2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["committed", "lock", "samples.log"]


def test_frames_without_group_ids_are_read_from_their_samples(tmp_path):
    """Logs written before frames carried ``groups`` open, select and report their backlog."""
    first = make_samples(2, weight_version=[1, 2], seed=1, group_id="a")
    second = make_samples(1, weight_version=3, seed=2, group_id="b")
    frames = b""
    for start, samples in ((0, first), (2, second)):
        stored = [msgspec.structs.replace(s, sequence=start + i) for i, s in enumerate(samples)]
        payload = msgspec.msgpack.encode(
            {
                "first_sequence": start,
                "versions": [s.weight_version for s in stored],
                "samples": stored,
            }
        )
        frames += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "samples.log").write_bytes(MAGIC + frames)
    with FileSampleBuffer(tmp_path) as buffer:
        assert buffer.backlog().groups == 2
        assert buffer.backlog().per_version == {1: 1, 2: 1, 3: 1}
        assert [s.sequence for s in buffer.select(max_samples=9).samples] == [0, 1, 2]
        buffer.commit(1)
        assert buffer.backlog().groups == 1
        buffer.restore(-1)
        assert buffer.backlog().groups == 2
        assert [s.sequence for s in buffer.append(make_samples(1, seed=3))] == [3]


def test_rewinding_reads_the_frames_again(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer:
        stored = []
        for seed in range(6):
            stored += buffer.append(make_samples(2, weight_version=seed, seed=seed))
        buffer.commit(8)
    with FileSampleBuffer(tmp_path) as buffer:
        assert list(buffer.select(max_samples=99).samples) == stored[9:]
        buffer.restore(2)
        assert list(buffer.select(max_samples=99).samples) == stored[3:]
        assert buffer.backlog().per_version == {1: 1, 2: 2, 3: 2, 4: 2, 5: 2}
    assert (tmp_path / "committed").read_bytes() == b'{"watermark":2}\n'


def test_one_frame_per_append(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer:
        buffer.append(make_samples(3, seed=1))
        buffer.append([])
        buffer.append(make_samples(1, seed=2))
    assert len(_frames((tmp_path / "samples.log").read_bytes())) == 2


# --------------------------------------------------------------------------------------------
# Recovery
# --------------------------------------------------------------------------------------------


def _three_batches(path):
    with FileSampleBuffer(path) as buffer:
        batches = [buffer.append(make_samples(n, seed=n)) for n in (2, 3, 4)]
    return batches


@pytest.mark.parametrize("keep", [0, 1, 7, 8, 9, 0.5, -1])
def test_torn_tail_is_cut_and_complete_records_survive(tmp_path, keep):
    batches = _three_batches(tmp_path)
    log = tmp_path / "samples.log"
    data = log.read_bytes()
    start, end = _frames(data)[-1]
    kept = int((end - start) * keep) if isinstance(keep, float) else keep % (end - start)
    log.write_bytes(data[: start + kept])
    with FileSampleBuffer(tmp_path) as buffer:
        assert log.stat().st_size == start
        assert list(buffer.select(max_samples=100).samples) == batches[0] + batches[1]
        assert buffer.pending() == 5
        assert [s.sequence for s in buffer.append(make_samples(1, seed=9))] == [5]
    with FileSampleBuffer(tmp_path) as buffer:
        assert buffer.pending() == 6


def test_zero_filled_tail_is_cut(tmp_path):
    batches = _three_batches(tmp_path)
    log = tmp_path / "samples.log"
    size = log.stat().st_size
    with open(log, "ab") as handle:
        handle.write(b"\x00" * 4096)
    with FileSampleBuffer(tmp_path) as buffer:
        assert log.stat().st_size == size
        assert list(buffer.select(max_samples=100).samples) == [s for b in batches for s in b]


def test_last_frame_failing_its_checksum_is_cut(tmp_path):
    batches = _three_batches(tmp_path)
    log = tmp_path / "samples.log"
    data = bytearray(log.read_bytes())
    data[-3] ^= 0xFF
    log.write_bytes(bytes(data))
    with FileSampleBuffer(tmp_path) as buffer:
        assert list(buffer.select(max_samples=100).samples) == batches[0] + batches[1]


def test_damage_before_the_tail_is_refused(tmp_path):
    _three_batches(tmp_path)
    log = tmp_path / "samples.log"
    data = bytearray(log.read_bytes())
    start, end = _frames(bytes(data))[0]
    data[end - 2] ^= 0xFF
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=f"record at byte {start} fails its checksum"):
        FileSampleBuffer(tmp_path)
    assert log.read_bytes() == bytes(data)
    with pytest.raises(StorageError):
        FileSampleBuffer(tmp_path)


def test_torn_file_header_starts_over(tmp_path):
    (tmp_path / "samples.log").write_bytes(MAGIC[:3])
    with FileSampleBuffer(tmp_path) as buffer:
        assert buffer.pending() == 0
        assert [s.sequence for s in buffer.append(make_samples(2))] == [0, 1]
    assert (tmp_path / "samples.log").read_bytes()[:8] == MAGIC


def test_foreign_file_is_refused(tmp_path):
    (tmp_path / "samples.log").write_bytes(b"hello, this is not a log")
    with pytest.raises(StorageError, match="is not a sample buffer log"):
        FileSampleBuffer(tmp_path)


def test_watermark_past_the_log_is_refused(tmp_path):
    _three_batches(tmp_path)
    (tmp_path / "committed").write_bytes(b'{"watermark":9}')
    with pytest.raises(StorageError, match="up to 9 were consumed, but the log ends at 8"):
        FileSampleBuffer(tmp_path)


def test_failed_append_leaves_no_partial_frame(tmp_path, monkeypatch):
    buffer = FileSampleBuffer(tmp_path)
    first = buffer.append(make_samples(2, seed=1))

    def disk_full(fd, data):
        os.write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable, "write_all", disk_full)
    with pytest.raises(StorageError, match="nothing was stored"):
        buffer.append(make_samples(3, seed=2))
    monkeypatch.undo()
    second = buffer.append(make_samples(1, seed=3))
    assert [s.sequence for s in second] == [2]
    buffer.close()
    with FileSampleBuffer(tmp_path) as reopened:
        assert list(reopened.select(max_samples=10).samples) == first + second


# --------------------------------------------------------------------------------------------
# Use
# --------------------------------------------------------------------------------------------


def test_second_instance_on_one_directory_is_refused(tmp_path):
    first = FileSampleBuffer(tmp_path)
    with pytest.raises(StorageError, match="already open"):
        FileSampleBuffer(tmp_path)
    first.close()
    FileSampleBuffer(tmp_path).close()


def test_commit_past_the_last_sample_raises(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer:
        buffer.append(make_samples(2))
        with pytest.raises(ValueError, match="the last appended sample is 1"):
            buffer.commit(2)
        assert buffer.committed() == -1


def test_select_needs_a_positive_size(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer, pytest.raises(ValueError, match="got 0"):
        buffer.select(max_samples=0)


def test_closed_buffer_refuses_calls_and_closes_twice(tmp_path):
    buffer = FileSampleBuffer(tmp_path)
    buffer.close()
    buffer.close()
    with pytest.raises(StorageError, match="is closed"):
        buffer.append(make_samples(1))


def test_creates_missing_parent_directories(tmp_path):
    with FileSampleBuffer(tmp_path / "a" / "b" / "buffer") as buffer:
        buffer.append(make_samples(1))
    assert (tmp_path / "a" / "b" / "buffer" / "samples.log").is_file()


def test_select_across_many_frames_after_commits(tmp_path):
    with FileSampleBuffer(tmp_path) as buffer:
        stored = []
        for seed in range(10):
            stored += buffer.append(make_samples(3, weight_version=seed % 3, seed=seed))
        buffer.commit(4)
        batch = buffer.select(max_samples=4, min_weight_version=1)
        fresh = [s for s in stored[5:] if s.weight_version >= 1]
        assert list(batch.samples) == fresh[:4]
        assert batch.watermark == fresh[3].sequence
