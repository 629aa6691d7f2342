"""Opening a store read-only: no lock, nothing written, created or truncated; a torn tail or a
segment still being created is skipped; a writer in another process appending meanwhile goes on
undisturbed and every record it wrote reads back intact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from rllm_core.errors import StorageError
from rllm_core.testing.suites.storage import expected_prompts, make_trace_chain
from rllm_trace_store_deltachain.plugin import DeltaChainConfig
from rllm_trace_store_deltachain.segments import MAGIC
from rllm_trace_store_deltachain.store import DeltaChainTraceStore


def _files(path) -> dict[str, tuple[bytes, int]]:
    """Every file of the directory with its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(path.iterdir())}


def _reader(path, **options) -> DeltaChainTraceStore:
    return DeltaChainTraceStore.open_read_only(DeltaChainConfig(path=path, **options))


def test_a_torn_tail_is_skipped_and_every_file_left_byte_identical(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 5, seed=3)
    with DeltaChainTraceStore(path) as store:
        for record in records:
            store.append(record)
    (segment,) = sorted(path.glob("segment-*.log"))
    whole = segment.read_bytes()
    with DeltaChainTraceStore(path) as store:
        store.append(make_trace_chain("torn", 1, seed=4)[0])
    # The new frame, cut in its payload: what a reader sees while the writer is mid-write.
    segment.write_bytes(segment.read_bytes()[: len(whole) + 20])
    (path / "segment-00000001.log").write_bytes(MAGIC[:3])  # a segment being created
    before = _files(path)
    with _reader(path) as reader:
        assert reader.read_only
        assert reader.sessions() == ["s"]
        assert reader.chain("s") == records
        truth = expected_prompts(records)
        assert [t.prompt_token_ids for t in reader.session("s")] == [
            truth[r.trace_id] for r in records
        ]
        last = reader.trace("s", records[-1].trace_id)
        assert last is not None and last.prompt_token_ids == truth[records[-1].trace_id]
        assert _files(path) == before
    assert _files(path) == before


def test_a_read_only_store_refuses_writes_and_creates_nothing(tmp_path):
    path = tmp_path / "t"
    with pytest.raises(StorageError, match="no trace store"):
        _reader(path)
    assert not path.exists()
    path.mkdir()
    with _reader(path) as reader:
        assert reader.sessions() == []
        with pytest.raises(StorageError, match="read-only"):
            reader.append(make_trace_chain("s", 1, seed=1)[0])
        with pytest.raises(StorageError, match="read-only"):
            reader.delete_session("s")
    assert list(path.iterdir()) == []
    with pytest.raises(StorageError, match="closed"):
        reader.sessions()


def test_readers_open_beside_a_writer_that_holds_the_lock(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 6, seed=5)
    with DeltaChainTraceStore(path, segment_bytes=4096) as writer:
        for index, record in enumerate(records):
            writer.append(record)
            with _reader(path) as reader, _reader(path) as other:
                assert reader.chain("s") == records[: index + 1]
                assert other.chain("s") == records[: index + 1]
        with pytest.raises(StorageError, match="already open"):
            DeltaChainTraceStore(path)


_WRITER = textwrap.dedent(
    """
    import sys, time
    from rllm_core.testing.suites.storage import make_trace_chain
    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    with DeltaChainTraceStore(sys.argv[1], segment_bytes=16384, snapshot_every=4) as store:
        print("open", flush=True)
        for record in make_trace_chain("live", int(sys.argv[2]), seed=11):
            store.append(record)
            time.sleep(0.002)
    print("done", flush=True)
    """
)


def test_a_live_writer_in_another_process_is_undisturbed_by_readers(tmp_path):
    path = tmp_path / "t"
    count = 400
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "open"
        records = make_trace_chain("live", count, seed=11)
        truth = expected_prompts(records)
        reads, seen = 0, 0
        while writer.poll() is None:
            with _reader(path, segment_bytes=16384, snapshot_every=4) as reader:
                chain = reader.chain("live")
                assert len(chain) >= seen
                assert chain == records[: len(chain)]
                traces = reader.session("live")
                assert [t.prompt_token_ids for t in traces] == [truth[r.trace_id] for r in chain]
                seen = len(chain)
            reads += 1
            time.sleep(0.01)
        stdout, stderr = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, stderr
    assert "done" in stdout
    assert reads >= 3 and seen > 0
    assert len(list(path.glob("segment-*.log"))) > 1
    with DeltaChainTraceStore(path, segment_bytes=16384, snapshot_every=4) as store:
        chain = store.chain("live")
        assert chain == records
        assert [t.prompt_token_ids for t in store.session("live")] == [
            truth[r.trace_id] for r in records
        ]
