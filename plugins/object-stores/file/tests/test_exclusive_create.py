"""``put_if_absent`` across processes: many writers race for every key of one directory."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest
from rllm_object_store_file.objects import FileObjectStore

WRITERS = 32
ROUNDS = 500

pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or "fork" not in multiprocessing.get_all_start_methods(),
    reason="the race needs forked writer processes",
)


def _writer(root, writer, start, results):
    store = FileObjectStore(root)
    data = f"writer-{writer}".encode()
    start.wait()
    won = bytes(store.put_if_absent(f"round/{r}", data) for r in range(ROUNDS))
    results.put((writer, won))


def test_one_writer_process_creates_each_key(tmp_path):
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WRITERS, timeout=60)
    results = context.Queue()
    root = str(tmp_path / "store")
    FileObjectStore(root)
    writers = [
        context.Process(target=_writer, args=(root, w, start, results)) for w in range(WRITERS)
    ]
    for process in writers:
        process.start()
    outcomes = dict(results.get(timeout=120) for _ in writers)
    for process in writers:
        process.join(timeout=60)
        assert process.exitcode == 0, f"writer process {process.pid} exited {process.exitcode}"

    store = FileObjectStore(root)
    assert store.list("round/") == sorted(f"round/{r}" for r in range(ROUNDS))
    for r in range(ROUNDS):
        winners = [w for w in range(WRITERS) if outcomes[w][r]]
        assert len(winners) == 1, f"round {r}: writers {winners} were each told they created it"
        assert store.get(f"round/{r}") == f"writer-{winners[0]}".encode()
    assert os.listdir(tmp_path / "store" / "tmp") == []
