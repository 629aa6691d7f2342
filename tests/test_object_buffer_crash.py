"""kill -9 trials for the sample buffer in an object store, over the ``file`` object store.

A child process (forked from the test process, which has imported everything) appends
deterministic records under one writer name, commits now and then, and is killed at a random
time or at a chosen point: after its payload is stored but before it takes an index position,
after it took the position but before ``append`` returned, and around the watermark's put.
Then the index must hold exactly the records 0..k-1, where k is the number of acknowledged
records or one more, every one of them readable; a new append follows on, and opening the
buffer twice more changes nothing.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from rllm_core.storage.object_buffer import ObjectStoreSampleBuffer
from rllm_core.testing.suites.storage import make_samples
from rllm_core.types import Sample
from rllm_object_store_file.objects import FileObjectStore

PREFIX = "runs/crash/buffer"
WATCHDOG_S = 60.0
STARTS = list(itertools.accumulate((1 + i % 3 for i in range(10_000)), initial=0))
"""``STARTS[r]``: the first sequence number of record ``r``."""


def record(index: int) -> list[Sample]:
    """The samples of record ``index`` (one append), sequence numbers unset."""
    return make_samples(
        1 + index % 3, weight_version=index % 7, seed=index, group_id=f"r{index % 5}"
    )


def _die(*args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# The child
# --------------------------------------------------------------------------------------------


def _child(store: Any, report: int) -> None:
    """Append records from where the index ends, reporting ``a R`` once record R was
    acknowledged, ``C W`` before committing W and ``c W`` once committed."""
    buffer = ObjectStoreSampleBuffer(store, PREFIX, writer="sampler")
    index = bisect.bisect_left(STARTS, buffer.committed() + 1 + buffer.pending())
    while True:
        stored = buffer.append(record(index))
        os.write(report, f"a {index}\n".encode())
        if index % 4 == 3:
            watermark = stored[-1].sequence - 2
            os.write(report, f"C {watermark}\n".encode())
            buffer.commit(watermark)
            os.write(report, f"c {watermark}\n".encode())
        index += 1


def _run_child(
    open_store: Callable[[], Any],
    *,
    kill_after_s: float | None,
    fault: Callable[[Any], None] | None = None,
) -> list[str]:
    """Fork a child that opens the store, lets ``fault`` change it, and runs :func:`_child`;
    SIGKILL it after ``kill_after_s`` (or let the fault kill it). Return its report lines."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            store = open_store()
            if fault is not None:
                fault(store)
            _child(store, write)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    os.close(write)
    overdue = threading.Event()

    def kill_overdue() -> None:
        overdue.set()
        os.kill(pid, signal.SIGKILL)

    watchdog = threading.Timer(WATCHDOG_S, kill_overdue)
    watchdog.start()
    try:
        if kill_after_s is not None:
            time.sleep(kill_after_s)
            os.kill(pid, signal.SIGKILL)
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        os.close(read)
        _, status = os.waitpid(pid, 0)
    finally:
        watchdog.cancel()
    assert not overdue.is_set(), f"the child still ran after {WATCHDOG_S}s: no fault killed it"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the child ended with status {status} instead of being killed; see its stderr"
    )
    return b"".join(chunks).decode().splitlines()


def _on_put(which: str, number: int, *, after: bool) -> Callable[[Any], None]:
    """A fault: the child dies at its ``number``-th ``put_if_absent`` of a key containing
    ``/<which>/`` (or put of ``committed`` for ``which="committed"``), before the call or
    just after it returned."""

    def install(store: Any) -> None:
        name = "put" if which == "committed" else "put_if_absent"
        original = getattr(store, name)
        calls = itertools.count(1)

        def put_or_die(key: str, data: bytes) -> Any:
            chosen = key.endswith("/committed") if which == "committed" else f"/{which}/" in key
            if not chosen or next(calls) != number:
                return original(key, data)
            if not after:
                _die()
            result = original(key, data)
            _die()
            return result

        setattr(store, name, put_or_die)

    return install


# --------------------------------------------------------------------------------------------
# Checking what a kill left
# --------------------------------------------------------------------------------------------


@dataclass
class Trials:
    open_store: Callable[[], Any]
    records: int = 0
    committed: int = -1

    def check(self, lines: list[str]) -> tuple[int, int]:
        """Check the store after a killed child that reported ``lines`` and append the next
        record; return (acknowledged records, records in the index)."""
        acked = [int(line.split()[1]) for line in lines if line.startswith("a ")]
        acknowledged = acked[-1] + 1 if acked else self.records
        assert acked == list(range(self.records, acknowledged)), "acknowledgments out of order"
        done = [int(line.split()[1]) for line in lines if line.startswith("c ")]
        attempted = [int(line.split()[1]) for line in lines if line.startswith("C ")]
        lowest = done[-1] if done else self.committed
        highest = attempted[-1] if attempted else lowest

        store = self.open_store()
        records = len(store.list(f"{PREFIX}/index/"))
        assert acknowledged <= records <= acknowledged + 1, (
            f"{acknowledged} records were acknowledged, the index holds {records}"
        )
        buffer = ObjectStoreSampleBuffer(store, PREFIX, missing_payload_timeout_s=0.0)
        committed = buffer.committed()
        assert committed in (lowest, highest)
        buffer.restore(-1)
        everything = list(buffer.select(max_samples=10**9).samples)
        assert buffer.skipped_positions == 0
        assert everything == [
            s
            for r in range(records)
            for s in [
                msgspec.structs.replace(sample, sequence=STARTS[r] + i)
                for i, sample in enumerate(record(r))
            ]
        ]
        buffer.restore(committed)
        stored = buffer.append(record(records))
        assert [s.sequence for s in stored] == list(range(STARTS[records], STARTS[records + 1]))
        keys = store.list()
        view = (buffer.committed(), buffer.pending(), buffer.backlog())
        for _ in range(2):
            again = ObjectStoreSampleBuffer(self.open_store(), PREFIX)
            assert (again.committed(), again.pending(), again.backlog()) == view
            assert store.list() == keys
        self.records, self.committed = records + 1, committed
        return acknowledged, records


def _prepared(open_store: Callable[[], Any]) -> Trials:
    """A store with a few records and a commit, as earlier trials leave it."""
    trials = Trials(open_store)
    trials.check(_run_child(open_store, kill_after_s=None, fault=_on_put("index", 6, after=False)))
    return trials


@pytest.fixture
def open_store(tmp_path):
    root = tmp_path / "store"
    return lambda: FileObjectStore(root)


# --------------------------------------------------------------------------------------------
# The trials
# --------------------------------------------------------------------------------------------


def test_random_kills(open_store):
    rng = random.Random(3)
    trials = Trials(open_store)
    for _ in range(20):
        acknowledged, records = trials.check(
            _run_child(open_store, kill_after_s=rng.uniform(0, 0.08))
        )
        assert records - acknowledged in (0, 1)


def test_kill_after_the_payload_before_the_index(open_store):
    trials = _prepared(open_store)
    first = trials.records
    payloads = len(open_store().list(f"{PREFIX}/data/"))
    lines = _run_child(open_store, kill_after_s=None, fault=_on_put("index", 3, after=False))
    # Two acknowledged appends and the killed one's payload, which no index record names.
    assert len(open_store().list(f"{PREFIX}/data/")) == payloads + 3
    assert trials.check(lines) == (first + 2, first + 2)


def test_kill_after_the_index_before_append_returns(open_store):
    trials = _prepared(open_store)
    first = trials.records
    lines = _run_child(open_store, kill_after_s=None, fault=_on_put("index", 3, after=True))
    assert trials.check(lines) == (first + 2, first + 3)


@pytest.mark.parametrize("after", [False, True], ids=["before the put", "after the put"])
def test_kill_during_the_watermark_update(open_store, after):
    trials = _prepared(open_store)
    before = trials.committed
    lines = _run_child(open_store, kill_after_s=None, fault=_on_put("committed", 1, after=after))
    attempted = [int(line.split()[1]) for line in lines if line.startswith("C ")]
    assert len(attempted) == 1 and not any(line.startswith("c ") for line in lines)
    trials.check(lines)
    assert trials.committed == (attempted[0] if after else before)
