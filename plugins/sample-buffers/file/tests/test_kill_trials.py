"""kill -9 trials: a child process appends deterministic records to one buffer directory and
the test kills it, at a random time or at a chosen point of an append or a commit; then the
log must hold exactly the records 0..k-1, with valid checksums, where k is the number of
acknowledged records or one more.

Children are forked from the test process, which has imported everything already, so a trial
costs a fork and the work itself. The trials run one after another on the same directory: a
kill can land while the next child is still opening (recovering) the log the previous one left.

``test_random_kills`` runs 200 trials. The soak (marker ``slow``) runs 25 times
``RLLM_SOAK_REPEATS`` trials (2 unless set: 50), with longer runs between kills so that the log
grows larger (``RLLM_SOAK_REPEATS=40`` for a thousand).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from rllm_core.storage.durable import write_all
from rllm_core.storage.framing import FrameReader
from rllm_core.testing.suites.storage import (
    append_crash_records,
    crash_record,
    crash_record_starts,
)
from rllm_core.types import Sample
from rllm_sample_buffer_file import buffer as buffer_module
from rllm_sample_buffer_file.buffer import MAGIC, FileSampleBuffer

SOAK_REPEATS = int(os.environ.get("RLLM_SOAK_REPEATS", "2"))
RECORDS = 100_000
WATCHDOG_S = 60.0


STARTS = crash_record_starts(RECORDS)


class _Frame(msgspec.Struct):
    first_sequence: int
    samples: list[Sample]


# --------------------------------------------------------------------------------------------
# The child
# --------------------------------------------------------------------------------------------


def _child(path: Path, report: int, fault: Callable[[], None] | None) -> None:
    """Append records from where the log ends, reporting on ``report``: ``a R`` once record R
    was acknowledged, ``C W`` before committing W and ``c W`` once committed."""
    if fault is not None:
        fault()
    append_crash_records(FileSampleBuffer(path), report, STARTS)


def _run_child(
    path: Path, *, kill_after_s: float | None, fault: Callable[[], None] | None = None
) -> list[str]:
    """Fork a child running :func:`_child`; SIGKILL it after ``kill_after_s`` (or let the
    fault kill it). Return its report lines."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            _child(path, write, fault)
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


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Checking what a kill left
# --------------------------------------------------------------------------------------------


@dataclass
class Log:
    """What the trials know of the buffer directory: records 0..``records``-1 verified, the
    bytes of the log that held them (``verified_bytes``, CRC ``verified_crc``)."""

    path: Path
    records: int = 0
    committed: int = -1
    verified_bytes: int = len(MAGIC)
    verified_crc: int = field(default_factory=lambda: zlib.crc32(MAGIC))

    def check(self, lines: list[str]) -> tuple[int, int]:
        """Check the directory after a killed child that reported ``lines``; append the next
        record as a new writer would. Return (acknowledged records, records in the log)."""
        acked = [int(line.split()[1]) for line in lines if line.startswith("a ")]
        acknowledged = acked[-1] + 1 if acked else self.records
        assert acked == list(range(self.records, acknowledged)), "acknowledgments out of order"
        committed = [int(line.split()[1]) for line in lines if line.startswith("c ")]
        attempted = [int(line.split()[1]) for line in lines if line.startswith("C ")]
        lowest = committed[-1] if committed else self.committed
        highest = attempted[-1] if attempted else lowest

        with FileSampleBuffer(self.path) as buffer:
            records = self._verify_log()
            assert acknowledged <= records <= acknowledged + 1, (
                f"{acknowledged} records were acknowledged, the log holds {records}"
            )
            assert buffer.committed() in (lowest, highest)
            assert buffer.committed() + 1 + buffer.pending() == STARTS[records]
            stored = buffer.append(crash_record(records))
            assert [s.sequence for s in stored] == list(range(STARTS[records], STARTS[records + 1]))
            view = (buffer.committed(), buffer.pending(), buffer.backlog())
        records += 1
        size = (self.path / "samples.log").stat().st_size
        for _ in range(2):
            with FileSampleBuffer(self.path) as again:
                assert (again.committed(), again.pending(), again.backlog()) == view
            assert (self.path / "samples.log").stat().st_size == size
        assert self._verify_log() == records
        self.committed = view[0]
        return acknowledged, records - 1

    def _verify_log(self) -> int:
        """Check that the log is records 0..k-1 with valid checksums (the part verified before
        unchanged, the rest decoded); return k."""
        log = self.path / "samples.log"
        data = log.read_bytes()
        assert zlib.crc32(data[: self.verified_bytes]) == self.verified_crc, (
            "bytes of verified records changed"
        )
        with open(log, "rb") as handle:
            reader = FrameReader(handle, len(data), self.verified_bytes, name=str(log))
            index = self.records
            for _, payload in reader:
                frame = msgspec.msgpack.decode(payload, type=_Frame)
                expected = [
                    msgspec.structs.replace(s, sequence=STARTS[index] + i)
                    for i, s in enumerate(crash_record(index))
                ]
                assert frame.first_sequence == STARTS[index]
                assert frame.samples == expected, f"record {index} does not hold what was appended"
                index += 1
        assert reader.torn == 0, f"{reader.torn} bytes after the last record of an open log"
        self.records = index
        self.verified_bytes = reader.end
        self.verified_crc = zlib.crc32(data[: reader.end])
        return index


# --------------------------------------------------------------------------------------------
# Random kills
# --------------------------------------------------------------------------------------------


def _random_trials(tmp_path: Path, trials: int, longest_s: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    log = Log(tmp_path / "buffer")
    FileSampleBuffer(log.path).close()
    slack = []
    for _ in range(trials):
        acknowledged, records = log.check(
            _run_child(log.path, kill_after_s=rng.uniform(0, longest_s))
        )
        slack.append(records - acknowledged)
    return slack


def test_random_kills(tmp_path):
    started = time.monotonic()
    slack = _random_trials(tmp_path, trials=200, longest_s=0.03, seed=1)
    assert set(slack) <= {0, 1}
    assert time.monotonic() - started < 60, "200 trials must stay under a minute"


@pytest.mark.slow
def test_random_kills_soak(tmp_path):
    slack = _random_trials(tmp_path, trials=25 * SOAK_REPEATS, longest_s=0.2, seed=2)
    assert set(slack) <= {0, 1}


# --------------------------------------------------------------------------------------------
# Kills at chosen points
# --------------------------------------------------------------------------------------------


def _at_append(number: int, write: Callable[[int, bytes], object]) -> Callable[[], None]:
    """A fault for the child: its ``number``-th append only does ``write(fd, frame)`` and
    then the process is killed."""

    def install() -> None:
        append = buffer_module.append_durably
        calls = itertools.count(1)

        def append_or_die(fd: int, data: bytes, **kwargs: object) -> None:
            if next(calls) == number:
                write(fd, data)
                _die()
            append(fd, data, **kwargs)

        buffer_module.append_durably = append_or_die

    return install


def _prepared(tmp_path: Path) -> Log:
    """A log with a few records and a commit, as earlier trials leave it."""
    log = Log(tmp_path / "buffer")
    FileSampleBuffer(log.path).close()
    log.check(_run_child(log.path, kill_after_s=None, fault=_at_append(6, write_all)))
    return log


def test_kill_with_half_a_frame_written(tmp_path):
    log = _prepared(tmp_path)
    first = log.records
    half = _at_append(3, lambda fd, data: write_all(fd, data[: len(data) // 2]))
    lines = _run_child(log.path, kill_after_s=None, fault=half)
    assert (log.path / "samples.log").stat().st_size > log.verified_bytes, "half a frame is there"
    assert log.check(lines) == (first + 2, first + 2)


def test_kill_after_the_write_before_the_fsync(tmp_path):
    log = _prepared(tmp_path)
    first = log.records
    lines = _run_child(log.path, kill_after_s=None, fault=_at_append(3, write_all))
    assert log.check(lines) == (first + 2, first + 3)


@pytest.mark.parametrize("moment", ["before the rename", "after the rename"])
def test_kill_during_the_watermark_update(tmp_path, moment):
    log = _prepared(tmp_path)

    def install() -> None:
        replace = buffer_module.replace_file

        def replace_and_die(path: Path, data: bytes, *, durable: bool) -> None:
            if moment == "after the rename":
                replace(path, data, durable=durable)
            else:
                (path.parent / f".{path.name}.torn.tmp").write_bytes(data[: len(data) // 2])
            _die()

        buffer_module.replace_file = replace_and_die

    before = log.committed
    lines = _run_child(log.path, kill_after_s=None, fault=install)
    attempted = [int(line.split()[1]) for line in lines if line.startswith("C ")]
    assert len(attempted) == 1 and not any(line.startswith("c ") for line in lines)
    log.check(lines)
    assert log.committed == (before if moment == "before the rename" else attempted[0])
