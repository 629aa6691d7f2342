"""kill -9 trials for the sample buffer in an object store, over the ``file`` object store and
over S3 on a moto server.

A child process appends deterministic records under one writer name, commits now and then,
and is killed at a random time or at a chosen point: after its payload is stored but before it
takes an index position, after it took the position but before ``append`` returned, and
around the watermark's put. Then the index must hold exactly the records 0..k-1, where k is
the number of acknowledged records or one more, every one of them readable; a new append
follows on, and opening the buffer twice more changes nothing.

Children are forked by a small fork server: a fresh interpreter that imports this module once
and forks a child per trial. It builds a store of each kind once, to load the client library,
but never sends a request, so no child inherits a client's connections; a trial costs a fork,
not an interpreter start.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rllm_core.plugins.manager import PluginManager
from rllm_core.testing.suites.storage import (
    append_crash_records,
    crash_record,
    crash_record_starts,
)
from rllm_sample_buffer_object_store.buffer import ObjectStoreSampleBuffer

PREFIX = "runs/crash/buffer"
WATCHDOG_S = 60.0
STARTS = crash_record_starts(10_000)


@functools.cache
def _plugins() -> PluginManager:
    return PluginManager()


def build_store(kind: str, config: dict[str, Any]) -> Any:
    """An ``object_store:<kind>`` built from plan keys through the installed plugins."""
    return _plugins().get("object_store", kind).build(config)


# --------------------------------------------------------------------------------------------
# The fork server and its children
# --------------------------------------------------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install_fault(store: Any, which: str, number: int, after: bool) -> None:
    """The child dies at its ``number``-th ``put_if_absent`` of a key containing ``/which/``
    (or ``put`` of ``committed`` for ``which == "committed"``), before the call or just after
    it returned."""
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


def _child(trial: dict[str, Any], ready: int) -> None:
    """Open the store, say so on ``ready``, then append records from where the index ends,
    writing ``a R`` to the report file once record R was acknowledged, ``C W`` before
    committing W and ``c W`` once committed."""
    report = os.open(trial["report"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    store = build_store(trial["kind"], trial["config"])
    if trial["fault"]:
        _install_fault(store, *trial["fault"])
    os.write(ready, b"r")
    os.close(ready)
    append_crash_records(ObjectStoreSampleBuffer(store, PREFIX, writer="sampler"), report, STARTS)


def serve() -> None:
    """The fork server's loop: one JSON trial per line on stdin; for each, fork a child and
    print ``<pid> ready`` once it has opened its store (``<pid> gone`` if it died first), then
    wait for it and print its wait status."""
    warmed: set[str] = set()
    for line in sys.stdin:
        trial = json.loads(line)
        if trial["kind"] not in warmed:
            # Building a store (no request yet, so no connection) loads its client library
            # once here rather than in every child.
            warm = build_store(trial["kind"], trial["config"])
            getattr(warm, "close", lambda: None)()
            warmed.add(trial["kind"])
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                _child(trial, write)
            finally:
                os._exit(70)
        os.close(write)
        state = "ready" if os.read(read, 1) == b"r" else "gone"
        os.close(read)
        print(pid, state, flush=True)
        print(os.waitpid(pid, 0)[1], flush=True)


class ForkServer:
    def __init__(self) -> None:
        load = (
            "import importlib.util, sys;"
            f" spec = importlib.util.spec_from_file_location('rllm_crash_trials', {__file__!r});"
            " module = importlib.util.module_from_spec(spec);"
            " sys.modules[spec.name] = module;"
            " spec.loader.exec_module(module);"
            " module.serve()"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", load], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, trial: dict[str, Any], kill_after_s: float | None) -> None:
        """Run one child; SIGKILL it ``kill_after_s`` after it has its store (or let its fault
        kill it)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(trial) + "\n")
        self.process.stdin.flush()
        pid_text, state = self.process.stdout.readline().split()
        pid = int(pid_text)
        overdue = threading.Event()

        def kill_overdue() -> None:
            overdue.set()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

        watchdog = threading.Timer(
            WATCHDOG_S if kill_after_s is None else kill_after_s, kill_overdue
        )
        watchdog.start()
        try:
            status = int(self.process.stdout.readline())
        finally:
            watchdog.cancel()
        assert state == "ready", f"the child died before it opened its store (status {status})"
        assert kill_after_s is not None or not overdue.is_set(), (
            f"the child still ran after {WATCHDOG_S}s: no fault killed it"
        )
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"the child ended with status {status} instead of being killed; see its stderr"
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


# --------------------------------------------------------------------------------------------
# Checking what a kill left
# --------------------------------------------------------------------------------------------


@dataclass
class Trials:
    kind: str
    config: dict[str, Any]
    folder: Path
    server: ForkServer
    store: Any
    records: int = 0
    committed: int = -1
    count: int = 0

    def run(self, *, kill_after_s: float | None = None, fault: tuple | None = None) -> list[str]:
        """Run one child; return its report lines."""
        self.count += 1
        report = self.folder / f"report-{self.count}"
        trial = {"kind": self.kind, "config": self.config, "report": str(report), "fault": fault}
        self.server.run(trial, kill_after_s)
        return report.read_text().splitlines() if report.exists() else []

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

        store = self.store
        records = len(store.list(f"{PREFIX}/index/"))
        assert acknowledged <= records <= acknowledged + 1, (
            f"{acknowledged} records were acknowledged, the index holds {records}"
        )
        buffer = ObjectStoreSampleBuffer(store, PREFIX, missing_payload_timeout_s=0.0)
        committed = buffer.committed()
        assert committed in (lowest, highest)
        # Records before the last one checked are create-only objects checked already.
        start = max(self.records - 1, 0)
        buffer.restore(STARTS[start] - 1)
        everything = list(buffer.select(max_samples=10**9).samples)
        assert buffer.skipped_positions == 0
        assert everything == [
            msgspec.structs.replace(sample, sequence=STARTS[r] + i)
            for r in range(start, records)
            for i, sample in enumerate(crash_record(r))
        ]
        buffer.restore(committed)
        stored = buffer.append(crash_record(records))
        assert [s.sequence for s in stored] == list(range(STARTS[records], STARTS[records + 1]))
        keys = store.list()
        view = (buffer.committed(), buffer.pending(), buffer.backlog())
        for _ in range(2):
            again = ObjectStoreSampleBuffer(store, PREFIX)
            assert (again.committed(), again.pending(), again.backlog()) == view
            assert store.list() == keys
        self.records, self.committed = records + 1, committed
        return acknowledged, records

    def payloads(self) -> int:
        return len(self.store.list(f"{PREFIX}/data/"))


@pytest.fixture(params=["file", "s3"])
def trials(request, tmp_path, fork_server) -> Iterator[Trials]:
    """The trials' bookkeeping, and the store the test checks through (a buffer opened on it
    anew is a reopened buffer: the store client holds no buffer state)."""
    if request.param == "file":
        config = {"root": str(tmp_path / "store")}
    else:
        server = request.getfixturevalue("s3_server")
        config = server.store_config(server.create_bucket())
    store = build_store(request.param, config)
    yield Trials(request.param, config, tmp_path, fork_server, store)
    close = getattr(store, "close", None)
    if callable(close):
        close()


def _prepared(trials: Trials) -> Trials:
    """A store with a few records and a commit, as earlier trials leave it."""
    trials.check(trials.run(fault=("index", 6, False)))
    return trials


# --------------------------------------------------------------------------------------------
# The trials
# --------------------------------------------------------------------------------------------


def test_random_kills(trials):
    # Up to about ten appends before the kill: a moto round trip takes some milliseconds.
    longest = {"file": 0.08, "s3": 0.4}[trials.kind]
    rng = random.Random(3)
    for _ in range(20):
        acknowledged, records = trials.check(trials.run(kill_after_s=rng.uniform(0, longest)))
        assert records - acknowledged in (0, 1)


def test_kill_after_the_payload_before_the_index(trials):
    first = _prepared(trials).records
    payloads = trials.payloads()
    lines = trials.run(fault=("index", 3, False))
    # Two acknowledged appends and the killed one's payload, which no index record names.
    assert trials.payloads() == payloads + 3
    assert trials.check(lines) == (first + 2, first + 2)


def test_kill_after_the_index_before_append_returns(trials):
    first = _prepared(trials).records
    assert trials.check(trials.run(fault=("index", 3, True))) == (first + 2, first + 3)


@pytest.mark.parametrize("after", [False, True], ids=["before the put", "after the put"])
def test_kill_during_the_watermark_update(trials, after):
    before = _prepared(trials).committed
    lines = trials.run(fault=("committed", 1, after))
    attempted = [int(line.split()[1]) for line in lines if line.startswith("C ")]
    assert len(attempted) == 1 and not any(line.startswith("c ") for line in lines)
    trials.check(lines)
    assert trials.committed == (attempted[0] if after else before)
