"""Both trace stores pass the trace-store conformance suite; the disk store in every
configuration that changes how it writes (snapshots on every record, tiny segments, fsync)."""

from __future__ import annotations

from typing import ClassVar

import pytest
from rllm_core.testing.suites.storage import TraceStoreConformance
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_trace_store_deltachain.store import DeltaChainTraceStore


class TestMemoryTraceStore(TraceStoreConformance):
    @pytest.fixture
    def trace_store(self):
        store = MemoryTraceStore()
        yield store
        store.close()

    @pytest.fixture
    def reopen(self):
        return lambda store: store


class _DiskFixtures:
    options: ClassVar[dict[str, object]] = {}

    @pytest.fixture
    def opened(self):
        stores: list[DeltaChainTraceStore] = []
        yield stores
        for store in stores:
            store.close()

    @pytest.fixture
    def trace_store(self, tmp_path, opened):
        opened.append(DeltaChainTraceStore(tmp_path / "traces", **self.options))
        return opened[-1]

    @pytest.fixture
    def reopen(self, opened):
        def _reopen(store: DeltaChainTraceStore) -> DeltaChainTraceStore:
            store.close()
            opened.append(DeltaChainTraceStore(store.path, **self.options))
            return opened[-1]

        return _reopen


class TestDeltaChainDefaults(_DiskFixtures, TraceStoreConformance):
    options: ClassVar[dict[str, object]] = {}


class TestDeltaChainSnapshotEveryRecord(_DiskFixtures, TraceStoreConformance):
    options: ClassVar[dict[str, object]] = {"snapshot_every": 1}


class TestDeltaChainSmallSegmentsFsync(_DiskFixtures, TraceStoreConformance):
    options: ClassVar[dict[str, object]] = {
        "segment_bytes": 4096,
        "snapshot_every": 3,
        "fsync": True,
    }
