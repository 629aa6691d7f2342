"""The sample buffer in an object store: the conformance suite over the ``file`` object store
and over an in-process store, many writer processes with one reader, the missing-payload rule,
restore, and what polling costs."""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from rllm_core.errors import ObjectNotFoundError, StorageError
from rllm_core.plugins.manager import PluginManager
from rllm_core.testing.suites.storage import (
    SampleBufferConformance,
    buffer_programs,
    make_samples,
)
from rllm_core.types import BacklogStats, Sample
from rllm_object_store_file.objects import FileObjectStore
from rllm_sample_buffer_object_store.buffer import (
    PAYLOAD_MAGIC,
    SKIPPED_MAGIC,
    ObjectStoreSampleBuffer,
)

PREFIX = "runs/r1/buffer"


class DictStore:
    """Objects in a dict, with the ObjectStore methods; ``calls`` records each call."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.calls.append(("put", key))
            self.objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self._lock:
            self.calls.append(("put_if_absent", key))
            if key in self.objects:
                return False
            self.objects[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        with self._lock:
            self.calls.append(("get", key))
            if key not in self.objects:
                raise ObjectNotFoundError(f"no object under {key!r}")
            return self.objects[key]

    def exists(self, key: str) -> bool:
        with self._lock:
            self.calls.append(("exists", key))
            return key in self.objects

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        with self._lock:
            self.calls.append(("list", start_after))
            return sorted(
                k
                for k in self.objects
                if k.startswith(prefix) and (start_after is None or k > start_after)
            )

    def take_calls(self) -> list[tuple[str, str | None]]:
        calls, self.calls = self.calls, []
        return calls


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------------------------
# Conformance
# --------------------------------------------------------------------------------------------

FACTORY_SOURCE = f"""
from rllm_sample_buffer_object_store.buffer import ObjectStoreSampleBuffer
from rllm_object_store_file.objects import FileObjectStore

def open_store(location):
    return ObjectStoreSampleBuffer(FileObjectStore(location), {PREFIX!r})
"""


class TestOverTheFileObjectStore(SampleBufferConformance):
    @pytest.fixture
    def sample_buffer(self, tmp_path):
        return ObjectStoreSampleBuffer(FileObjectStore(tmp_path / "store"), PREFIX)

    @pytest.fixture
    def reopen(self):
        return lambda buffer: ObjectStoreSampleBuffer(FileObjectStore(buffer.store.root), PREFIX)

    @pytest.fixture
    def subprocess_factory_source(self):
        return FACTORY_SOURCE


@functools.cache
def _plugins() -> PluginManager:
    return PluginManager()


class TestOverS3OnMoto(SampleBufferConformance):
    @pytest.fixture
    def config(self, s3_server, s3_bucket):
        return s3_server.store_config(s3_bucket)

    @pytest.fixture
    def open_s3(self, config):
        stores = []

        def _open():
            stores.append(_plugins().get("object_store", "s3").build(config))
            return stores[-1]

        yield _open
        for store in stores:
            store.close()

    @pytest.fixture
    def sample_buffer(self, open_s3):
        return ObjectStoreSampleBuffer(open_s3(), PREFIX)

    @pytest.fixture
    def reopen(self, open_s3):
        return lambda buffer: ObjectStoreSampleBuffer(open_s3(), PREFIX)

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(program=buffer_programs())
    def test_any_program_matches_a_model(self, sample_buffer, reopen, program):
        """Fewer programs than the suite's 40: every step is several round trips to moto."""
        SampleBufferConformance.test_any_program_matches_a_model.hypothesis.inner_test(
            self, sample_buffer, reopen, program
        )

    @pytest.fixture
    def subprocess_factory_source(self, config):
        return f"""
from rllm_core.plugins.manager import PluginManager
from rllm_sample_buffer_object_store.buffer import ObjectStoreSampleBuffer

def open_store(location):
    store = PluginManager().get("object_store", "s3").build({config!r})
    return ObjectStoreSampleBuffer(store, {PREFIX!r})
"""


class TestOverAnInProcessStore(SampleBufferConformance):
    """Compressed payloads, one writer name per instance, and the buffer at the store's root."""

    @pytest.fixture
    def sample_buffer(self):
        return ObjectStoreSampleBuffer(DictStore(), "", writer="w0", compress=True)

    @pytest.fixture
    def reopen(self):
        def _reopen(buffer):
            return ObjectStoreSampleBuffer(buffer.store, "", writer="w0", compress=True)

        return _reopen


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


def test_layout():
    store = DictStore()
    buffer = ObjectStoreSampleBuffer(store, PREFIX, writer="sampler-0")
    buffer.append(make_samples(2, weight_version=[3, 4], seed=1, group_id="a"))
    buffer.append(make_samples(1, weight_version=5, seed=2, group_id="b"))
    buffer.commit(1)
    assert sorted(store.objects) == [
        f"{PREFIX}/committed",
        f"{PREFIX}/data/sampler-0/000000000000",
        f"{PREFIX}/data/sampler-0/000000000001",
        f"{PREFIX}/index/000000000000",
        f"{PREFIX}/index/000000000001",
    ]
    record = msgspec.msgpack.decode(store.objects[f"{PREFIX}/index/000000000001"])
    assert record == {
        "writer": "sampler-0",
        "payload": f"{PREFIX}/data/sampler-0/000000000001",
        "first_sequence": 2,
        "versions": [5],
        "groups": ["b"],
    }
    payload = store.objects[f"{PREFIX}/data/sampler-0/000000000000"]
    assert payload[:9] == PAYLOAD_MAGIC + b"\x00"
    assert len(msgspec.msgpack.decode(payload[9:])["samples"]) == 2
    assert msgspec.json.decode(store.objects[f"{PREFIX}/committed"]) == {
        "watermark": 1,
        "position": 1,
    }


def test_compressed_payloads_are_read_by_any_instance():
    store = DictStore()
    writer = ObjectStoreSampleBuffer(store, PREFIX, compress=True)
    stored = writer.append(make_samples(20, seed=3))
    (key,) = [k for k in store.objects if "/data/" in k]
    assert store.objects[key][:9] == PAYLOAD_MAGIC + b"\x01"
    reader = ObjectStoreSampleBuffer(store, PREFIX)
    assert list(reader.select(max_samples=99).samples) == stored


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"prefix": "runs/r1/"}, "must not start or end with '/'"),
        ({"writer": "a/b"}, "one non-empty key segment"),
        ({"writer": ""}, "one non-empty key segment"),
        ({"missing_payload_timeout_s": -1}, "0 or more"),
    ],
)
def test_bad_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        ObjectStoreSampleBuffer(DictStore(), **({"prefix": PREFIX} | arguments))


def test_closed_buffer_refuses_calls():
    buffer = ObjectStoreSampleBuffer(DictStore(), PREFIX)
    buffer.close()
    buffer.close()
    with pytest.raises(StorageError, match="is closed"):
        buffer.append(make_samples(1))
    with pytest.raises(StorageError, match="is closed"):
        buffer.select(max_samples=1)


def test_a_gap_in_the_index_is_refused():
    store = DictStore()
    buffer = ObjectStoreSampleBuffer(store, PREFIX)
    for seed in range(3):
        buffer.append(make_samples(1, seed=seed))
    store.delete(f"{PREFIX}/index/000000000001")
    with pytest.raises(StorageError, match="jumps from position 0 to 2"):
        ObjectStoreSampleBuffer(store, PREFIX).select(max_samples=9)


def test_a_watermark_the_index_does_not_hold_is_refused():
    store = DictStore()
    buffer = ObjectStoreSampleBuffer(store, PREFIX)
    buffer.append(make_samples(2))
    store.put(f"{PREFIX}/committed", b'{"watermark": 5, "position": 1}')
    with pytest.raises(StorageError, match="says samples up to 5 were consumed"):
        ObjectStoreSampleBuffer(store, PREFIX).pending()
    store.put(f"{PREFIX}/committed", b"not json")
    with pytest.raises(StorageError, match="is not a sample buffer watermark"):
        ObjectStoreSampleBuffer(store, PREFIX)


# --------------------------------------------------------------------------------------------
# Many writers, one reader
# --------------------------------------------------------------------------------------------

WRITERS = 4
APPENDS = 25


def _write(root: str, writer: int, ready_fd: int, go_fd: int) -> None:
    """Append ``APPENDS`` batches as writer ``writer`` once the parent says go; print an ack
    line (writer, append, first sequence) after each."""
    buffer = ObjectStoreSampleBuffer(FileObjectStore(root), PREFIX, writer=f"w{writer}")
    os.write(ready_fd, b"r")
    os.read(go_fd, 1)
    for index in range(APPENDS):
        samples = make_samples(
            1 + (writer + index) % 3,
            weight_version=index,
            seed=writer * 1000 + index,
            group_id=f"w{writer}-{index}",
        )
        stored = buffer.append(samples)
        print("ack", writer, index, stored[0].sequence, flush=True)


def _fork_writer(root: str, writer: int, ready_w: int, go_r: int) -> tuple[int, int]:
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.dup2(out_w, 1)
            sys.stdout = os.fdopen(1, "w", closefd=False)
            _write(root, writer, ready_w, go_r)
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            os._exit(status)
    os.close(out_w)
    return pid, out_r


def test_concurrent_writer_processes_and_a_reader(tmp_path):
    """Every acknowledged sample is delivered exactly once, in sequence order without gaps,
    while the reader selects and commits as the writers append."""
    root = str(tmp_path / "store")
    FileObjectStore(root)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    children = [_fork_writer(root, w, ready_w, go_r) for w in range(WRITERS)]
    for _ in children:
        assert os.read(ready_r, 1) == b"r"
    reader = ObjectStoreSampleBuffer(FileObjectStore(root), PREFIX, writer="trainer")
    os.write(go_w, b"g" * WRITERS)
    delivered = []
    statuses = []
    deadline = time.monotonic() + 120
    while len(statuses) < WRITERS or reader.pending():
        assert time.monotonic() < deadline, f"writers still running: {statuses}"
        batch = reader.select(max_samples=7)
        delivered.extend(batch.samples)
        reader.commit(batch.watermark)
        if len(statuses) < WRITERS:
            for pid, _ in children:
                if pid not in (p for p, _ in statuses):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        statuses.append((pid, status))
    assert all(status == 0 for _, status in statuses), statuses
    acks = []
    for _, out in children:
        with os.fdopen(out) as lines:
            acks += [tuple(int(x) for x in line.split()[1:]) for line in lines]
    assert len(acks) == WRITERS * APPENDS
    total = sum(1 + (w + i) % 3 for w, i, _ in acks)
    assert [s.sequence for s in delivered] == list(range(total))
    by_sequence = {s.sequence: s for s in delivered}
    for writer, index, first in acks:
        expected = make_samples(
            1 + (writer + index) % 3,
            weight_version=index,
            seed=writer * 1000 + index,
            group_id=f"w{writer}-{index}",
        )
        got = [by_sequence[first + i] for i in range(len(expected))]
        assert got == [
            msgspec.structs.replace(s, sequence=first + i) for i, s in enumerate(expected)
        ]
    assert ObjectStoreSampleBuffer(FileObjectStore(root), PREFIX).committed() == total - 1


def test_writers_sharing_a_name_never_overwrite_a_payload():
    store = DictStore()
    first = ObjectStoreSampleBuffer(store, PREFIX, writer="same")
    stored = first.append(make_samples(2, seed=1))
    second = ObjectStoreSampleBuffer(store, PREFIX, writer="same")
    stored += second.append(make_samples(1, seed=2))
    stored += first.append(make_samples(3, seed=3))
    assert [s.sequence for s in stored] == list(range(6))
    reader = ObjectStoreSampleBuffer(store, PREFIX)
    assert list(reader.select(max_samples=99).samples) == stored


def test_a_writer_that_loses_a_position_takes_the_next_one():
    store = DictStore()
    one = ObjectStoreSampleBuffer(store, PREFIX)
    two = ObjectStoreSampleBuffer(store, PREFIX)
    a = one.append(make_samples(2, seed=1))
    b = two.append(make_samples(3, seed=2))
    c = one.append(make_samples(1, seed=3))
    assert [s.sequence for s in a + b + c] == list(range(6))
    index = [k for k in store.objects if "/index/" in k]
    assert len(index) == 3


def test_a_new_writer_finds_the_end_of_a_long_index_with_few_calls():
    store = DictStore()
    writer = ObjectStoreSampleBuffer(store, PREFIX)
    for seed in range(100):
        writer.append(make_samples(1, seed=seed))
    store.take_calls()
    late = ObjectStoreSampleBuffer(store, PREFIX)
    (stored,) = late.append(make_samples(1, seed=100))
    assert stored.sequence == 100
    calls = store.take_calls()
    assert ("list", None) not in calls
    assert sum(1 for name, _ in calls if name == "exists") <= 2 * math.ceil(math.log2(100)) + 2


# --------------------------------------------------------------------------------------------
# A position whose payload is missing
# --------------------------------------------------------------------------------------------


@dataclass
class LostPayload:
    """Batches a (2 samples), b (3, whose payload is gone, as if it never landed) and c (1),
    and a reader with a hand-driven clock."""

    store: DictStore
    clock: Clock
    reader: ObjectStoreSampleBuffer
    a: list[Sample]
    b: list[Sample]
    c: list[Sample]
    key: str

    @classmethod
    def make(cls, timeout: float = 30.0) -> LostPayload:
        store = DictStore()
        clock = Clock()
        writer = ObjectStoreSampleBuffer(store, PREFIX)
        a = writer.append(make_samples(2, seed=1, group_id="a"))
        b = writer.append(make_samples(3, seed=2, group_id="b"))
        c = writer.append(make_samples(1, seed=3, group_id="c"))
        key = f"{PREFIX}/data/{writer.writer}/000000000001"
        store.delete(key)
        reader = ObjectStoreSampleBuffer(
            store, PREFIX, missing_payload_timeout_s=timeout, clock=clock
        )
        return cls(store, clock, reader, a, b, c, key)

    def payload_of_b(self) -> bytes:
        """The bytes b's writer would have stored."""
        other = ObjectStoreSampleBuffer(DictStore(), PREFIX, writer="x")
        other.append(self.b)
        (data,) = [v for k, v in other.store.objects.items() if "/data/" in k]
        return data


def test_a_missing_payload_holds_back_later_positions_until_the_timeout(caplog):
    lost = LostPayload.make()
    batch = lost.reader.select(max_samples=99)
    assert list(batch.samples) == lost.a
    assert batch.watermark == 1
    lost.reader.commit(batch.watermark)
    assert lost.reader.pending() == 4
    lost.clock.now += 29.9
    assert lost.reader.select(max_samples=99).samples == ()
    assert lost.reader.skipped_positions == 0
    lost.clock.now += 0.1
    with caplog.at_level(logging.WARNING, logger="rllm_sample_buffer_object_store.buffer"):
        batch = lost.reader.select(max_samples=99)
    assert list(batch.samples) == lost.c
    assert batch.watermark == 5
    assert lost.reader.skipped_positions == 1
    assert lost.reader.pending() == 1
    assert lost.reader.backlog() == BacklogStats(
        samples=1, groups=1, oldest_weight_version=0, per_version={0: 1}
    )
    assert lost.key in caplog.text
    assert "skipping index position 1 (sequences 2..4" in caplog.text
    assert lost.store.objects[lost.key].startswith(SKIPPED_MAGIC)


def test_a_skipped_position_stays_skipped_for_later_readers():
    lost = LostPayload.make(timeout=0.0)
    assert list(lost.reader.select(max_samples=99).samples) == lost.a + lost.c
    later = ObjectStoreSampleBuffer(lost.store, PREFIX, missing_payload_timeout_s=1e9)
    assert list(later.select(max_samples=99).samples) == lost.a + lost.c
    assert later.skipped_positions == 1


def test_a_payload_that_arrives_within_the_timeout_is_delivered():
    lost = LostPayload.make()
    assert list(lost.reader.select(max_samples=99).samples) == lost.a
    lost.clock.now += 10
    lost.store.put(lost.key, lost.payload_of_b())
    assert list(lost.reader.select(max_samples=99).samples) == lost.a + lost.b + lost.c
    assert lost.reader.skipped_positions == 0


def test_a_payload_that_lands_while_the_reader_gives_up_is_delivered():
    lost = LostPayload.make(timeout=0.0)
    late = lost.payload_of_b()
    claim = lost.store.put_if_absent

    def racing_claim(key: str, data: bytes) -> bool:
        if key == lost.key:
            lost.store.put(key, late)
        return claim(key, data)

    lost.store.put_if_absent = racing_claim
    assert list(lost.reader.select(max_samples=99).samples) == lost.a + lost.b + lost.c
    assert lost.reader.skipped_positions == 0


def test_stale_samples_of_a_lost_payload_do_not_wait_for_it():
    lost = LostPayload.make()
    batch = lost.reader.select(max_samples=99, min_weight_version=1)
    assert batch.samples == ()
    assert batch.watermark == 5


# --------------------------------------------------------------------------------------------
# Restore and following the committed watermark
# --------------------------------------------------------------------------------------------


def test_restore_far_back_reads_few_index_records():
    store = DictStore()
    buffer = ObjectStoreSampleBuffer(store, PREFIX)
    stored = []
    for seed in range(64):
        stored += buffer.append(make_samples(2, seed=seed))
    buffer.commit(buffer.select(max_samples=120).watermark)
    reader = ObjectStoreSampleBuffer(store, PREFIX)
    assert reader.pending() == 8
    store.take_calls()
    reader.restore(40)
    gets = [key for name, key in store.take_calls() if name == "get"]
    assert len(gets) <= 2 * math.ceil(math.log2(64)) + (128 - 41) // 2 + 1
    assert list(reader.select(max_samples=200).samples) == stored[41:]
    assert ObjectStoreSampleBuffer(store, PREFIX).committed() == 40


def test_a_writer_follows_the_readers_watermark():
    store = DictStore()
    sampler = ObjectStoreSampleBuffer(store, PREFIX, writer="sampler")
    trainer = ObjectStoreSampleBuffer(store, PREFIX, writer="trainer")
    sampler.append(make_samples(3, weight_version=[1, 2, 3], seed=1))
    assert sampler.backlog().samples == 3
    trainer.commit(trainer.select(max_samples=2).watermark)
    assert sampler.committed() == 1
    assert sampler.backlog() == BacklogStats(
        samples=1, groups=1, oldest_weight_version=3, per_version={3: 1}
    )
    trainer.restore(-1)
    assert sampler.pending() == 3


# --------------------------------------------------------------------------------------------
# What polling costs
# --------------------------------------------------------------------------------------------


def test_polling_lists_only_new_index_keys_and_reads_each_payload_once():
    store = DictStore()
    writer = ObjectStoreSampleBuffer(store, PREFIX, writer="w")
    reader = ObjectStoreSampleBuffer(store, PREFIX, writer="r")
    for seed in range(5):
        writer.append(make_samples(2, seed=seed))
    reader.commit(reader.select(max_samples=3).watermark)
    store.take_calls()
    for _ in range(3):
        assert len(reader.select(max_samples=99).samples) == 7
    last = f"{PREFIX}/index/000000000004"
    assert store.take_calls() == [
        ("list", last),
        *[("get", f"{PREFIX}/data/w/00000000000{n}") for n in (2, 3, 4)],
        ("list", last),
        ("list", last),
    ]
    writer.append(make_samples(1, seed=9))
    store.take_calls()
    reader.select(max_samples=99)
    assert store.take_calls() == [
        ("list", last),
        ("get", f"{PREFIX}/index/000000000005"),
        ("get", f"{PREFIX}/data/w/000000000005"),
    ]


def test_one_instance_that_appends_and_selects_reads_nothing_back():
    store = DictStore()
    buffer = ObjectStoreSampleBuffer(store, PREFIX)
    buffer.append(make_samples(1, seed=0))
    buffer.commit(buffer.select(max_samples=1).watermark)
    for seed in range(1, 4):
        buffer.append(make_samples(2, seed=seed))
    store.take_calls()
    assert len(buffer.select(max_samples=99).samples) == 6
    assert [name for name, _ in store.take_calls()] == ["list"]


def test_sigkill_between_payload_and_index_leaves_no_position(tmp_path):
    """A writer killed after storing its payload but before taking a position leaves an
    unreferenced payload, and nothing for a reader to wait on."""
    root = str(tmp_path / "store")
    pid = os.fork()
    if pid == 0:
        try:
            store = FileObjectStore(root)
            buffer = ObjectStoreSampleBuffer(store, PREFIX, writer="w")
            buffer.append(make_samples(2, seed=1))
            claim = store.put_if_absent

            def die_before_the_index(key, data):
                if "/index/" in key:
                    os.kill(os.getpid(), signal.SIGKILL)
                return claim(key, data)

            store.put_if_absent = die_before_the_index
            buffer.append(make_samples(3, seed=2))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    store = FileObjectStore(root)
    assert store.list(f"{PREFIX}/data/w/") == [
        f"{PREFIX}/data/w/000000000000",
        f"{PREFIX}/data/w/000000000001",
    ]
    reader = ObjectStoreSampleBuffer(store, PREFIX, missing_payload_timeout_s=1e9)
    assert [s.sequence for s in reader.select(max_samples=99).samples] == [0, 1]
    assert [s.sequence for s in reader.append(make_samples(1, seed=3))] == [2]
    assert reader.pending() == 3
