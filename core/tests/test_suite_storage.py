"""The storage conformance suites pass on correct stores and fail on broken ones."""

from __future__ import annotations

import importlib.util
import inspect
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.testing.suites.storage import (
    ObjectStoreConformance,
    SampleBufferConformance,
    TraceStoreConformance,
    expected_prompts,
    make_samples,
    make_trace_chain,
    run_until_killed,
)
from rllm_core.types import Sample, SampleBatch, Trace, TraceRecord

REFERENCE_PATH = Path(__file__).with_name("reference_stores.py")
REFERENCE_MODULE = "rllm_core_reference_stores"


def _load_reference_stores() -> ModuleType:
    if REFERENCE_MODULE in sys.modules:
        return sys.modules[REFERENCE_MODULE]
    spec = importlib.util.spec_from_file_location(REFERENCE_MODULE, REFERENCE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[REFERENCE_MODULE] = module
    spec.loader.exec_module(module)
    return module


ref = _load_reference_stores()


def _factory_source(class_name: str, arguments: str = "location") -> str:
    """Source for ``subprocess_factory_source`` that opens a reference store in any process;
    ``arguments`` is what the store's class is called with."""
    return f"""
import importlib.util, sys

def open_store(location):
    name = {REFERENCE_MODULE!r}
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, {str(REFERENCE_PATH)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[name], {class_name!r})({arguments})
"""


# --------------------------------------------------------------------------------------------
# The suites pass on the reference stores
# --------------------------------------------------------------------------------------------


class TestMemoryTraceStore(TraceStoreConformance):
    @pytest.fixture
    def trace_store(self):
        return ref.MemoryTraceStore()

    @pytest.fixture
    def reopen(self):
        return lambda store: store


class TestMemorySampleBuffer(SampleBufferConformance):
    @pytest.fixture
    def sample_buffer(self):
        return ref.MemorySampleBuffer()

    @pytest.fixture
    def reopen(self):
        return lambda buffer: ref.MemorySampleBuffer(buffer.state)


class TestCoreMemorySampleBuffer(SampleBufferConformance):
    """The buffer an async run uses when its plan names none."""

    rewinds = False

    @pytest.fixture
    def sample_buffer(self):
        return MemorySampleBuffer()

    @pytest.fixture
    def reopen(self):
        return lambda buffer: buffer


class TestJsonlSampleBuffer(SampleBufferConformance):
    @pytest.fixture
    def sample_buffer(self, tmp_path):
        return ref.JsonlSampleBuffer(str(tmp_path / "buffer"))

    @pytest.fixture
    def reopen(self):
        return lambda buffer: ref.JsonlSampleBuffer(str(buffer.root))

    @pytest.fixture
    def subprocess_factory_source(self):
        return _factory_source("JsonlSampleBuffer")


class TestMemoryObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def object_store(self):
        return MemoryObjectStore()


class TestDirectoryObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def object_store(self, tmp_path):
        return ref.DirectoryObjectStore(str(tmp_path / "objects"))

    @pytest.fixture
    def subprocess_factory_source(self):
        return _factory_source("DirectoryObjectStore")


def test_crash_tests_skip_without_a_factory_source(tmp_path):
    with pytest.raises(pytest.skip.Exception):
        SampleBufferConformance().test_acknowledged_appends_survive_sigkill(None, tmp_path)
    with pytest.raises(pytest.skip.Exception):
        ObjectStoreConformance().test_acknowledged_puts_survive_sigkill(None, tmp_path)


def test_suite_tests_carry_the_conformance_marker():
    for suite in (TraceStoreConformance, SampleBufferConformance, ObjectStoreConformance):
        assert [m.name for m in suite.pytestmark] == ["rllm_conformance"]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def test_expected_prompts_follows_the_delta_contract():
    def record(trace_id, parent, delta, completion):
        return TraceRecord(
            trace_id=trace_id,
            session_id="s",
            parent_trace_id=parent,
            prompt_delta_token_ids=delta,
            completion_token_ids=completion,
            logprobs=[0.0] * len(completion),
        )

    records = [
        record("c2", "c1", [9], [10]),
        record("r", None, [1, 2], [3]),
        record("c1", "r", [4], [5, 6]),
        record("orphan", "gone", [7], [8]),
        record("orphan-child", "orphan", [11], [12]),
    ]
    assert expected_prompts(records) == {
        "r": [1, 2],
        "c1": [1, 2, 3, 4],
        "c2": [1, 2, 3, 4, 5, 6, 9],
        "orphan": None,
        "orphan-child": None,
    }


def test_make_trace_chain_builds_a_consistent_chain():
    records = make_trace_chain("s", 4, seed=7)
    assert [r.turn for r in records] == [0, 1, 2, 3]
    assert records[0].parent_trace_id is None
    assert [r.parent_trace_id for r in records[1:]] == [r.trace_id for r in records[:3]]
    assert len({r.trace_id for r in records}) == 4
    assert make_trace_chain("s", 4, seed=7) == records
    fork = make_trace_chain("s", 2, parent=records[1], seed=8)
    assert [r.turn for r in fork] == [2, 3]
    assert fork[0].parent_trace_id == records[1].trace_id
    assert not {r.trace_id for r in fork} & {r.trace_id for r in records}
    reset = make_trace_chain("s", 1, first_turn=4, reset_reason="bridge", seed=9)[0]
    assert (reset.turn, reset.parent_trace_id, reset.reset_reason) == (4, None, "bridge")


def test_make_samples_is_deterministic():
    samples = make_samples(3, weight_version=[1, 2, 3], seed=4)
    assert samples == make_samples(3, weight_version=[1, 2, 3], seed=4)
    assert samples != make_samples(3, weight_version=[1, 2, 3], seed=5)
    assert [s.weight_version for s in samples] == [1, 2, 3]
    assert all(s.sequence == -1 for s in samples)
    with pytest.raises(ValueError, match="2 entries for 3 samples"):
        make_samples(3, weight_version=[1, 2])


def test_run_until_killed_returns_lines_up_to_the_kill():
    script = "import itertools\nfor i in itertools.count():\n    print('ack', i, flush=True)\n"
    lines = run_until_killed(script, acks=5)
    assert lines == [f"ack {i}" for i in range(5)]


def test_run_until_killed_fails_when_the_child_dies_first():
    script = "print('ack 0', flush=True)\nraise SystemExit('boom')\n"
    with pytest.raises(pytest.fail.Exception, match="1 of 3 acknowledgments"):
        run_until_killed(script, acks=3)


# --------------------------------------------------------------------------------------------
# The trace-store suite catches broken trace stores
# --------------------------------------------------------------------------------------------


class ClaimsCompleteTraceStore(ref.MemoryTraceStore):
    """Marks every trace complete, even one whose ancestor never landed."""

    def session(self, session_id: str) -> list[Trace]:
        return [
            msgspec.structs.replace(t, chain_complete=True) for t in super().session(session_id)
        ]


class PaddingTraceStore(ref.MemoryTraceStore):
    """Stands in zeros for the tokens of a missing ancestor."""

    def session(self, session_id: str) -> list[Trace]:
        return [
            t
            if t.chain_complete
            else msgspec.structs.replace(t, prompt_token_ids=[0] * 4 + t.prompt_token_ids)
            for t in super().session(session_id)
        ]


class DuplicatingTraceStore(ref.MemoryTraceStore):
    """Keeps a replay as a second record instead of replacing the first."""

    def __init__(self) -> None:
        super().__init__()
        self.replays: list[TraceRecord] = []

    def append(self, record: TraceRecord) -> None:
        if record.trace_id in self._sessions.get(record.session_id, {}):
            self.replays.append(record)
        else:
            super().append(record)

    def chain(self, session_id: str) -> list[TraceRecord]:
        return super().chain(session_id) + [r for r in self.replays if r.session_id == session_id]

    def session(self, session_id: str) -> list[Trace]:
        extra = [r for r in self.replays if r.session_id == session_id]
        return super().session(session_id) + [
            Trace(record=r, prompt_token_ids=[], chain_complete=False) for r in extra
        ]


class AppendOrderTraceStore(ref.MemoryTraceStore):
    """Returns records in the order they landed, not by lineage and turn."""

    def chain(self, session_id: str) -> list[TraceRecord]:
        return list(self._sessions.get(session_id, {}).values())


class CachingTraceStore(ref.MemoryTraceStore):
    """Freezes each full prompt when the record lands; later replays of a parent are ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen: dict[str, list[int]] = {}

    def append(self, record: TraceRecord) -> None:
        super().append(record)
        for trace in super().session(record.session_id):
            if trace.chain_complete:
                self.frozen.setdefault(trace.record.trace_id, trace.prompt_token_ids)

    def session(self, session_id: str) -> list[Trace]:
        traces = super().session(session_id)
        return [
            msgspec.structs.replace(t, prompt_token_ids=self.frozen.get(t.record.trace_id, []))
            for t in traces
        ]


class ParentByTurnTraceStore(ref.MemoryTraceStore):
    """Takes the lineage's record one turn earlier as the parent, ignoring parent ids."""

    def session(self, session_id: str) -> list[Trace]:
        records = self.chain(session_id)
        by_turn = {(r.lineage_id, r.turn): r for r in records}
        traces = []
        for record in records:
            prompt: list[int] = []
            cursor: TraceRecord | None = record
            pieces = []
            while cursor is not None:
                pieces.append(cursor)
                if cursor.parent_trace_id is None:
                    break
                cursor = by_turn.get((cursor.lineage_id, cursor.turn - 1))
            for piece in reversed(pieces):
                prompt = prompt + piece.prompt_delta_token_ids
                if piece is not record:
                    prompt = prompt + piece.completion_token_ids
            traces.append(Trace(record=record, prompt_token_ids=prompt))
        return traces


class RecursiveTraceStore(ref.MemoryTraceStore):
    """Rebuilds each prompt by recursing up the chain."""

    def session(self, session_id: str) -> list[Trace]:
        records = self._sessions.get(session_id, {})

        def prompt(trace_id: str) -> list[int]:
            record = records[trace_id]
            if record.parent_trace_id is None:
                return list(record.prompt_delta_token_ids)
            parent = records[record.parent_trace_id]
            return (
                prompt(parent.trace_id)
                + parent.completion_token_ids
                + record.prompt_delta_token_ids
            )

        return [
            Trace(record=r, prompt_token_ids=prompt(r.trace_id)) for r in self.chain(session_id)
        ]


def _reopen_same(store):
    return store


@pytest.mark.parametrize(
    ("store", "test"),
    [
        (ClaimsCompleteTraceStore, "test_missing_parent_is_incomplete_and_fabricates_nothing"),
        (PaddingTraceStore, "test_missing_parent_is_incomplete_and_fabricates_nothing"),
        (DuplicatingTraceStore, "test_replay_overwrites_in_place"),
        (AppendOrderTraceStore, "test_order_is_lineage_then_turn"),
        (AppendOrderTraceStore, "test_lineages_keep_separate_chains"),
        (CachingTraceStore, "test_replayed_parent_changes_what_children_rebuild"),
        (ParentByTurnTraceStore, "test_forks_rebuild_each_branch"),
        (DuplicatingTraceStore, "test_any_append_sequence_reads_back"),
    ],
)
def test_trace_suite_catches(store, test):
    with pytest.raises(AssertionError):
        getattr(TraceStoreConformance(), test)(store())


def test_trace_suite_catches_recursive_rebuilds():
    with pytest.raises(RecursionError):
        TraceStoreConformance().test_thousand_turn_session_rebuilds(RecursiveTraceStore())


def test_trace_suite_catches_a_store_that_forgets_on_reopen():
    with pytest.raises(AssertionError):
        TraceStoreConformance().test_survives_reopen(
            ref.MemoryTraceStore(), lambda store: ref.MemoryTraceStore()
        )


# --------------------------------------------------------------------------------------------
# The sample-buffer suite catches broken buffers
# --------------------------------------------------------------------------------------------


class ConsumingBuffer(ref.MemorySampleBuffer):
    """Select commits what it returns."""

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        batch = super().select(max_samples, min_weight_version)
        self.state.committed = batch.watermark
        return batch


class NoStaleSkipBuffer(ref.MemorySampleBuffer):
    """Ignores ``min_weight_version``."""

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        return super().select(max_samples, 0)


class BackwardsCommitBuffer(ref.MemorySampleBuffer):
    """Lets the watermark move backwards."""

    def commit(self, watermark: int) -> None:
        self.state.committed = watermark


class Float32Buffer(ref.MemorySampleBuffer):
    """Stores per-token floats in single precision."""

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        def narrow(values: list[float]) -> list[float]:
            return [
                struct.unpack("<f", struct.pack("<f", max(-3e38, min(3e38, v))))[0] for v in values
            ]

        narrowed = [
            msgspec.structs.replace(
                s,
                datum=msgspec.structs.replace(
                    s.datum,
                    logprobs=narrow(s.datum.logprobs),
                    advantages=narrow(s.datum.advantages),
                ),
            )
            for s in samples
        ]
        return super().append(narrowed)


class OneBasedBuffer(ref.MemorySampleBuffer):
    """Numbers samples from 1."""

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        return [
            msgspec.structs.replace(s, sequence=s.sequence + 1) for s in super().append(samples)
        ]


class LastReturnedWatermarkBuffer(ref.MemorySampleBuffer):
    """Reports the last returned sample as the watermark, not the last one considered."""

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        batch = super().select(max_samples, min_weight_version)
        last = batch.samples[-1].sequence if batch.samples else self.committed()
        return SampleBatch(samples=batch.samples, watermark=last)


class ForgetfulBuffer(ref.MemorySampleBuffer):
    """Keeps the watermark in the instance, so a reopened buffer forgets it."""

    def __init__(self, state=None) -> None:
        super().__init__(state)
        self._watermark = -1

    def commit(self, watermark: int) -> None:
        if watermark < self._watermark:
            raise ValueError("backwards")
        self._watermark = watermark

    def committed(self) -> int:
        return self._watermark

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        self.state.committed = self._watermark
        return super().select(max_samples, min_weight_version)


@pytest.mark.parametrize(
    ("buffer", "test"),
    [
        (ConsumingBuffer, "test_select_does_not_consume"),
        (NoStaleSkipBuffer, "test_select_skips_stale_samples"),
        (Float32Buffer, "test_datum_fields_round_trip_exactly"),
        (OneBasedBuffer, "test_append_assigns_gap_free_sequences_from_zero"),
        (LastReturnedWatermarkBuffer, "test_select_with_only_stale_samples_moves_the_watermark"),
        (LastReturnedWatermarkBuffer, "test_any_program_matches_a_model"),
        (ForgetfulBuffer, "test_reopen_sees_samples_and_watermark"),
    ],
)
def test_buffer_suite_catches(buffer, test):
    method = getattr(SampleBufferConformance(), test)
    arguments = {"sample_buffer": buffer()}
    if "reopen" in inspect.signature(method).parameters:
        arguments["reopen"] = lambda b: type(b)(b.state)
    with pytest.raises(AssertionError):
        method(**arguments)


def test_buffer_suite_catches_backwards_commits():
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        SampleBufferConformance().test_commit_backwards_raises(BackwardsCommitBuffer())


def test_buffer_crash_test_catches_a_buffer_that_is_not_durable(tmp_path):
    with pytest.raises(AssertionError):
        SampleBufferConformance().test_acknowledged_appends_survive_sigkill(
            _factory_source("MemorySampleBuffer", arguments=""), tmp_path
        )


# --------------------------------------------------------------------------------------------
# The object-store suite catches broken object stores
# --------------------------------------------------------------------------------------------


class UncheckedKeyStore(MemoryObjectStore):
    """Accepts any key."""

    def put(self, key: str, data: bytes) -> None:
        self._objects[key] = data


class InsertionOrderStore(MemoryObjectStore):
    """Lists keys in the order they were first stored."""

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return [k for k in self._objects if k.startswith(prefix)]


class DirectoryPrefixStore(MemoryObjectStore):
    """Treats a prefix as a directory name."""

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        folder = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        return sorted(k for k in self._objects if k.startswith(folder))


class InclusiveStartAfterStore(MemoryObjectStore):
    """Lists from ``start_after`` itself instead of after it."""

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        keys = super().list(prefix)
        return [k for k in keys if start_after is None or k >= start_after]


class IgnoredStartAfterStore(MemoryObjectStore):
    """Ignores ``start_after``."""

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return super().list(prefix)


class RacyIfAbsentStore(MemoryObjectStore):
    """Checks for the key, then writes it, with no lock between the two."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.exists(key):
            return False
        time.sleep(0.02)
        super().put(key, data)
        return True


class OverwritingIfAbsentStore(MemoryObjectStore):
    """Overwrites the existing object and then reports that the key existed."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        existed = self.exists(key)
        super().put(key, data)
        return not existed


class FalsyIfAbsentStore(MemoryObjectStore):
    """Creates the object but returns ``None`` instead of ``True``."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        super().put_if_absent(key, data)
        return None  # type: ignore[return-value]


class TornWriteStore(MemoryObjectStore):
    """Overwrites an object in place, half at a time."""

    def put(self, key: str, data: bytes) -> None:
        current = self._objects.get(key)
        if not isinstance(current, bytearray) or len(current) != len(data):
            self._objects[key] = bytearray(data)
            return
        half = len(data) // 2
        current[:half] = data[:half]
        time.sleep(0.005)
        current[half:] = data[half:]

    def get(self, key: str) -> bytes:
        return bytes(super().get(key))


@pytest.mark.parametrize(
    ("store", "test"),
    [
        (InsertionOrderStore, "test_list_is_sorted_and_prefix_filtered"),
        (DirectoryPrefixStore, "test_list_is_sorted_and_prefix_filtered"),
        (InclusiveStartAfterStore, "test_list_start_after"),
        (IgnoredStartAfterStore, "test_list_start_after"),
        (IgnoredStartAfterStore, "test_list_pages_through_every_key"),
        (RacyIfAbsentStore, "test_concurrent_put_if_absent_has_one_winner"),
        (OverwritingIfAbsentStore, "test_put_if_absent_leaves_an_existing_key_alone"),
        (FalsyIfAbsentStore, "test_put_if_absent_creates_a_missing_key"),
        (TornWriteStore, "test_readers_never_see_a_partial_object"),
    ],
)
def test_object_suite_catches(store, test):
    with pytest.raises(AssertionError):
        getattr(ObjectStoreConformance(), test)(store())


@pytest.mark.parametrize("key", ["a//b", "/abs", "a/../b"])
def test_object_suite_catches_unchecked_keys(key):
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        ObjectStoreConformance().test_invalid_keys_raise_value_error(UncheckedKeyStore(), key)


def test_object_crash_test_catches_a_store_that_is_not_durable(tmp_path):
    source = _factory_source("MemoryObjectStore", arguments="")
    with pytest.raises(AssertionError, match="was lost"):
        ObjectStoreConformance().test_acknowledged_puts_survive_sigkill(source, tmp_path)
