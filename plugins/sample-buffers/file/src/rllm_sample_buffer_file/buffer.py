"""The ``file`` sample buffer: an append-only, checksummed log in a directory.

Files in ``path``:

- ``samples.log``: the header ``RLLMSBL1``, then one frame per ``append`` call (see
  :mod:`rllm_core.storage.framing`) whose payload is the msgpack encoding of a
  :class:`_Batch`: the first sequence number, the weight version and group id of each sample
  and the samples themselves, sequence numbers included. One frame per call makes an append
  all or nothing.
- ``committed``: the committed watermark as JSON (``{"watermark": 41}``), replaced atomically.
- ``lock``: held with ``flock`` while an instance is open, so two processes never append to the
  same log.

An append returns only after its frame is written and, with ``fsync`` on, on stable storage.
Opening the buffer cuts a torn last frame (an append that never returned) and refuses a log
damaged anywhere else. Only the position, weight version and group id of unconsumed samples
stay in memory; ``select`` reads the samples it returns from the log, and ``restore`` to a
watermark below the committed one reads the frame headers again from the start.

Limits: the log is never compacted or rotated, so it grows with every sample ever appended and
opening reads it through once; one process opens a location at a time.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from rllm_core.errors import StorageError
from rllm_core.storage.durable import (
    acquire_directory_lock,
    append_durably,
    fsync_directory,
    make_directories,
    replace_file,
    write_all,
)
from rllm_core.storage.framing import FrameReader, encode_frame
from rllm_core.types import BacklogStats, Sample, SampleBatch

if TYPE_CHECKING:
    from rllm_sample_buffer_file.plugin import FileSampleBufferConfig


__all__ = ["FileSampleBuffer"]

MAGIC = b"RLLMSBL1"
"""The first bytes of ``samples.log``."""

log = logging.getLogger(__name__)

LOG_NAME = "samples.log"
WATERMARK_NAME = "committed"


class _Batch(msgspec.Struct, kw_only=True):
    first_sequence: int
    versions: list[int]
    samples: list[Sample]
    groups: list[str]


class _BatchHead(msgspec.Struct, kw_only=True):
    """The part of a batch that opening the log needs; decoding it skips the samples.

    ``groups`` is ``None`` in frames written before batches carried it: their group ids are
    read from the samples.
    """

    first_sequence: int
    versions: list[int]
    groups: list[str] | None = None


class _Samples(msgspec.Struct, kw_only=True):
    samples: list[Sample]


class _Watermark(msgspec.Struct, kw_only=True):
    watermark: int


@dataclass(frozen=True, slots=True)
class _Frame:
    first_sequence: int
    versions: tuple[int, ...]
    groups: tuple[str, ...]
    offset: int
    length: int

    @property
    def last_sequence(self) -> int:
        return self.first_sequence + len(self.versions) - 1


class FileSampleBuffer:
    """A :class:`~rllm_core.ports.SampleBuffer` in the directory ``path``.

    With ``fsync=True`` (the default) an acknowledged append or commit survives a power loss;
    with ``fsync=False`` it survives a killed process but not a crash of the machine.
    Thread-safe within one process.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self._samples_decoder = msgspec.msgpack.Decoder(_Samples)
        self._frames: list[_Frame] = []
        self._next_sequence = 0
        self._end = 0
        self._committed = -1
        self._log_fd: int | None = None
        self._lock_fd: int | None = None
        self._open()

    @classmethod
    def from_config(cls, config: FileSampleBufferConfig) -> FileSampleBuffer:
        """Build from the validated plan config (the component factory)."""
        return cls(config.path, fsync=config.fsync)

    # ---------------------------------------------------------------- opening

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        make_directories(self.path.parent, [self.path.name], durable=self.fsync)
        self._lock_fd = acquire_directory_lock(self.path, "sample buffer")
        try:
            self._log_fd = os.open(
                self.path / LOG_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644
            )
            self._load_log()
            self._committed = self._load_watermark()
        except BaseException:
            self._close_files()
            raise
        self._frames = [f for f in self._frames if f.last_sequence > self._committed]

    def _load_log(self) -> None:
        assert self._log_fd is not None
        name = str(self.path / LOG_NAME)
        size = os.fstat(self._log_fd).st_size
        if size < len(MAGIC):
            if os.pread(self._log_fd, size, 0) != MAGIC[:size]:
                raise StorageError(
                    f"{name} is not a sample buffer log (it does not start with {MAGIC!r});"
                    " point the buffer at another directory"
                )
            # A crash while the log was being created: start it again.
            os.ftruncate(self._log_fd, 0)
            write_all(self._log_fd, MAGIC)
            if self.fsync:
                os.fsync(self._log_fd)
                fsync_directory(self.path)
            self._end = len(MAGIC)
            return
        if os.pread(self._log_fd, len(MAGIC), 0) != MAGIC:
            raise StorageError(
                f"{name} is not a sample buffer log (it does not start with {MAGIC!r});"
                " point the buffer at another directory"
            )
        with open(self.path / LOG_NAME, "rb") as handle:
            reader = FrameReader(handle, size, len(MAGIC), name=name)
            self._frames = list(self._read_frames(reader, name))
        if self._frames:
            self._next_sequence = self._frames[-1].last_sequence + 1
        if reader.torn:
            log.warning(
                "%s: cutting %d bytes of an append that never completed (a crash during the"
                " write); every acknowledged sample is intact",
                name,
                reader.torn,
            )
            os.ftruncate(self._log_fd, reader.end)
            os.fsync(self._log_fd)
        self._end = reader.end

    @staticmethod
    def _read_frames(reader: FrameReader, name: str) -> Iterator[_Frame]:
        """The frame of every batch ``reader`` yields, checking that sequences follow on."""
        head_decoder = msgspec.msgpack.Decoder(_BatchHead)
        samples_decoder = msgspec.msgpack.Decoder(_Samples)
        next_sequence = 0
        for offset, payload in reader:
            try:
                head = head_decoder.decode(payload)
                groups = (
                    head.groups
                    if head.groups is not None
                    else [s.group_id for s in samples_decoder.decode(payload).samples]
                )
            except msgspec.DecodeError as exc:
                raise StorageError(
                    f"{name}: the record at byte {offset} is intact but not a batch of"
                    f" samples ({exc}); was it written by a newer rllm-sample-buffer-file?"
                ) from exc
            if head.first_sequence != next_sequence or len(groups) != len(head.versions):
                raise StorageError(
                    f"{name}: the record at byte {offset} starts at sequence"
                    f" {head.first_sequence} with {len(head.versions)} samples where"
                    f" {next_sequence} was expected; the file was modified outside the buffer"
                )
            yield _Frame(
                head.first_sequence, tuple(head.versions), tuple(groups), offset, len(payload)
            )
            next_sequence += len(head.versions)

    def _load_watermark(self) -> int:
        path = self.path / WATERMARK_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return -1
        try:
            watermark = msgspec.json.decode(data, type=_Watermark).watermark
        except msgspec.ValidationError as exc:
            raise StorageError(f"{path} is not a watermark file ({exc}); restore it") from exc
        if watermark >= self._next_sequence:
            raise StorageError(
                f"{path} says samples up to {watermark} were consumed, but the log ends at"
                f" {self._next_sequence - 1}: the log lost acknowledged samples (was fsync"
                " off during a machine crash?); restore the directory from a backup"
            )
        return watermark

    # ---------------------------------------------------------------- the port

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        """Number ``samples`` and write them as one frame; they are durable on return."""
        with self._lock:
            fd = self._require_open()
            if not samples:
                return []
            first = self._next_sequence
            stored = [
                msgspec.structs.replace(sample, sequence=first + i)
                for i, sample in enumerate(samples)
            ]
            versions = [sample.weight_version for sample in stored]
            groups = [sample.group_id for sample in stored]
            payload = self._encoder.encode(
                _Batch(first_sequence=first, versions=versions, samples=stored, groups=groups)
            )
            frame = encode_frame(payload)
            append_durably(
                fd,
                frame,
                end=self._end,
                fsync=self.fsync,
                what=f"appending {len(stored)} samples to {self.path / LOG_NAME}",
                on_lost_tail=self._close_files,
            )
            offset = self._end + len(frame) - len(payload)
            self._frames.append(_Frame(first, tuple(versions), tuple(groups), offset, len(payload)))
            self._end += len(frame)
            self._next_sequence += len(stored)
            return stored

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        """The oldest unconsumed samples, skipping stale ones; consumes nothing."""
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        with self._lock:
            fd = self._require_open()
            watermark = self._committed
            wanted: dict[int, list[int]] = {}
            count = 0
            for index, position, sequence, version, _ in self._unconsumed():
                if count == max_samples:
                    break
                watermark = sequence
                if version >= min_weight_version:
                    wanted.setdefault(index, []).append(position)
                    count += 1
            chosen: list[Sample] = []
            for index, positions in wanted.items():
                frame = self._frames[index]
                batch = self._samples_decoder.decode(os.pread(fd, frame.length, frame.offset))
                chosen.extend(batch.samples[p] for p in positions)
            return SampleBatch(samples=tuple(chosen), watermark=watermark)

    def commit(self, watermark: int) -> None:
        """Mark every sample up to ``watermark`` consumed, durably."""
        with self._lock:
            self._require_open()
            if watermark < self._committed:
                raise ValueError(
                    f"cannot commit watermark {watermark}: {self._committed} is already"
                    " committed and watermarks only move forward"
                )
            if watermark == self._committed:
                return
            if watermark >= self._next_sequence:
                raise ValueError(
                    f"cannot commit watermark {watermark}: the last appended sample is"
                    f" {self._next_sequence - 1}; commit the watermark a select returned"
                )
            self._store_watermark(watermark)
            self._drop_through(watermark)

    def restore(self, watermark: int) -> None:
        """Set the committed watermark, forwards or backwards, durably; see the port."""
        with self._lock:
            self._require_open()
            if not -1 <= watermark < self._next_sequence:
                raise ValueError(
                    f"cannot restore watermark {watermark}: it must lie between -1 and the last"
                    f" appended sample, {self._next_sequence - 1}"
                )
            if watermark == self._committed:
                return
            self._store_watermark(watermark)
            if watermark < self._committed:
                name = str(self.path / LOG_NAME)
                with open(self.path / LOG_NAME, "rb") as handle:
                    reader = FrameReader(handle, self._end, len(MAGIC), name=name)
                    self._frames = [
                        frame
                        for frame in self._read_frames(reader, name)
                        if frame.last_sequence > watermark
                    ]
            self._drop_through(watermark)

    def committed(self) -> int:
        with self._lock:
            return self._committed

    def pending(self) -> int:
        with self._lock:
            return self._next_sequence - 1 - self._committed

    def backlog(self) -> BacklogStats:
        with self._lock:
            return BacklogStats.of(
                (group, version) for _, _, _, version, group in self._unconsumed()
            )

    def close(self) -> None:
        """Release the directory; idempotent. Appends were durable already."""
        with self._lock:
            self._close_files()

    def _close_files(self) -> None:
        for name in ("_log_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    def __enter__(self) -> FileSampleBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileSampleBuffer({str(self.path)!r}, fsync={self.fsync})"

    def _unconsumed(self) -> Iterator[tuple[int, int, int, int, str]]:
        """``(frame index, position in frame, sequence, weight version, group id)`` of every
        unconsumed sample, oldest first."""
        for index, frame in enumerate(self._frames):
            for position, (version, group) in enumerate(
                zip(frame.versions, frame.groups, strict=True)
            ):
                sequence = frame.first_sequence + position
                if sequence > self._committed:
                    yield index, position, sequence, version, group

    def _store_watermark(self, watermark: int) -> None:
        replace_file(
            self.path / WATERMARK_NAME,
            msgspec.json.encode(_Watermark(watermark=watermark)) + b"\n",
            durable=self.fsync,
        )

    def _drop_through(self, watermark: int) -> None:
        self._committed = watermark
        drop = bisect.bisect_right(self._frames, watermark, key=lambda frame: frame.last_sequence)
        del self._frames[:drop]

    def _require_open(self) -> int:
        if self._log_fd is None:
            raise StorageError(f"the sample buffer at {self.path} is closed; open a new one")
        return self._log_fd
