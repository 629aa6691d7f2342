"""Append-only segment files of checksummed frames in one directory.

Files: ``segment-00000000.log``, ``segment-00000001.log``, ... Each starts with the 8 bytes
:data:`MAGIC` and holds frames in the format of :mod:`rllm_core.storage.framing` (length, CRC-32,
payload). Appends go to the newest segment; the caller starts a new one
(:meth:`SegmentLog.start_segment`) when :meth:`SegmentLog.needs_new_segment` says the next frame
would take the current one past ``segment_bytes``, because what it writes depends on the segment
(see :class:`~rllm_trace_store_deltachain.codec.SegmentTable`). ``lock`` is held with
``flock`` while the log is open, so two processes never append to the same files.

Opening reads every segment through once. A frame cut short by a crash is always the last thing
in its file: it is cut off with a warning, and every complete frame survives. A frame that fails
its checksum with more bytes after it means the file was damaged after it was written; opening
then refuses with :class:`~rllm_core.storage.framing.CorruptLogError` rather than guess.

A log opened with ``read_only=True`` reads the files of a directory another process may be
appending to: it takes no lock, creates, writes and truncates nothing, and reads up to the last
complete frame of each segment as it was when scanned (a frame still being written, or one a
crash cut short, is skipped, not cut). It sees the frames written before it was opened.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from rllm_core.errors import StorageError
from rllm_core.storage.durable import (
    acquire_directory_lock,
    append_durably,
    fsync_directory,
    write_all,
)
from rllm_core.storage.framing import FRAME_HEADER, CorruptLogError, FrameReader, encode_frame

__all__ = ["MAGIC", "Location", "SegmentLog"]

log = logging.getLogger(__name__)

MAGIC = b"RLLMDCT2"
_FORMAT_1 = b"RLLMDCT1"
_SEGMENT = re.compile(r"^segment-(\d{8})\.log$")
_OPEN_READERS = 32


class Location(NamedTuple):
    """Where a frame's payload lies: segment number, byte offset of the payload, its length."""

    segment: int
    offset: int
    length: int


def _segment_name(number: int) -> str:
    return f"segment-{number:08d}.log"


class SegmentLog:
    """The frames of a directory's segment files. Not thread-safe: callers hold a lock."""

    def __init__(
        self, path: Path, *, segment_bytes: int, fsync: bool, read_only: bool = False
    ) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.read_only = read_only
        self._open = False
        self._lock_fd: int | None = None
        self._active_fd: int | None = None
        self._active = 0
        self._active_size = 0
        self._readers: OrderedDict[int, int] = OrderedDict()

    # ---------------------------------------------------------------- opening

    def open(self, visit: Callable[[Location, bytes], None]) -> None:
        """Lock the directory and call ``visit`` with every intact frame, oldest first, cutting
        torn tails; then accept appends. On failure everything is closed again.

        Read-only: call ``visit`` with every intact frame and touch nothing; a missing
        directory is a :class:`~rllm_core.errors.StorageError`."""
        if self.read_only:
            if not self.path.is_dir():
                raise StorageError(
                    f"there is no trace store at {self.path} (the directory does not exist);"
                    " check the path"
                )
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = acquire_directory_lock(self.path, "trace store")
        self._open = True
        try:
            numbers = self._segment_numbers()
            for number in numbers:
                for location, payload in self._scan(number):
                    visit(location, payload)
            self._active = numbers[-1] if numbers else 0
            if not self.read_only:
                self._active_fd = self._open_segment(self._active)
                self._active_size = os.fstat(self._active_fd).st_size
        except BaseException:
            self.close()
            raise

    def _segment_numbers(self) -> list[int]:
        numbers = []
        for entry in os.listdir(self.path):
            match = _SEGMENT.match(entry)
            if match:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def _scan(self, number: int) -> Iterator[tuple[Location, bytes]]:
        file = self.path / _segment_name(number)
        try:
            handle = open(file, "rb" if self.read_only else "rb+")  # noqa: SIM115
        except FileNotFoundError:
            if self.read_only:
                return  # listed, then gone: nothing of it to read
            raise
        with handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(len(MAGIC))
            if head == _FORMAT_1:
                raise StorageError(
                    f"{file} holds traces in format 1 (it starts with {_FORMAT_1!r}), which"
                    " this rllm-trace-store-deltachain no longer reads: read it with the version"
                    " that wrote it, or point the store at another directory"
                )
            if head != MAGIC[: len(head)]:
                raise StorageError(
                    f"{file} is not a delta-chain segment (it does not start with {MAGIC!r});"
                    " move it out of the directory or point the store at another one"
                )
            if size < len(MAGIC):
                # A crash while the segment was being created (or, read-only, a writer creating
                # it now): it holds nothing yet.
                if self.read_only:
                    return
                handle.seek(0)
                handle.truncate(0)
                handle.write(MAGIC)
                handle.flush()
                os.fsync(handle.fileno())
                return
            reader = FrameReader(handle, size, len(MAGIC), name=str(file))
            for offset, payload in reader:
                yield Location(number, offset, len(payload)), payload
            if reader.torn and self.read_only:
                log.debug("%s: skipping %d bytes after the last complete record", file, reader.torn)
            elif reader.torn:
                log.warning(
                    "%s: cutting %d bytes of a record that was never completely written (a"
                    " crash during the write); every complete record is intact",
                    file,
                    reader.torn,
                )
                handle.truncate(reader.end)
                handle.flush()
                os.fsync(handle.fileno())

    def _open_segment(self, number: int) -> int:
        """Open (creating with its header when missing) segment ``number`` for appending."""
        file = self.path / _segment_name(number)
        fd = os.open(file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size == 0:
                write_all(fd, MAGIC)
                if self.fsync:
                    os.fsync(fd)
                    fsync_directory(self.path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ---------------------------------------------------------------- writing and reading

    @property
    def active_segment(self) -> int:
        """The number of the segment appends go to."""
        return self._active

    def needs_new_segment(self, payload_length: int) -> bool:
        """Whether a frame of ``payload_length`` bytes would take the active segment past
        ``segment_bytes``; an empty segment takes any frame."""
        self.require_writable()
        frame_length = FRAME_HEADER.size + payload_length
        return (
            self._active_size > len(MAGIC) and self._active_size + frame_length > self.segment_bytes
        )

    def start_segment(self) -> None:
        """Make a new, empty segment the one appends go to."""
        self.require_writable()
        fd = self._open_segment(self._active + 1)
        old = self._active_fd
        self._active_fd = fd
        self._active += 1
        self._active_size = os.fstat(fd).st_size
        if old is not None:
            os.close(old)

    def append(self, payload: bytes) -> Location:
        """Append one frame to the active segment; it has reached the operating system (and,
        with ``fsync``, the disk) when this returns."""
        fd = self.require_writable()
        frame = encode_frame(payload)
        append_durably(
            fd,
            frame,
            end=self._active_size,
            fsync=self.fsync,
            what=f"appending a trace to {self.path / _segment_name(self._active)}",
            on_lost_tail=self.close,
        )
        location = Location(self._active, self._active_size + FRAME_HEADER.size, len(payload))
        self._active_size += len(frame)
        return location

    def read(self, location: Location) -> bytes:
        """The payload at ``location``, checked against its checksum."""
        self.require_open()
        fd = self._reader(location.segment)
        start = location.offset - FRAME_HEADER.size
        frame = os.pread(fd, FRAME_HEADER.size + location.length, start)
        length, checksum = FRAME_HEADER.unpack_from(frame)
        payload = frame[FRAME_HEADER.size :]
        if length != location.length or zlib.crc32(payload) != checksum:
            raise CorruptLogError(
                f"{self.path / _segment_name(location.segment)}: the record at byte {start}"
                " changed since the store was opened (it fails its checksum); the file was"
                " modified outside the store, reopen it to re-read the files"
            )
        return payload

    def _reader(self, segment: int) -> int:
        if segment == self._active and self._active_fd is not None:
            return self._active_fd
        fd = self._readers.get(segment)
        if fd is not None:
            self._readers.move_to_end(segment)
            return fd
        fd = os.open(self.path / _segment_name(segment), os.O_RDONLY)
        self._readers[segment] = fd
        if len(self._readers) > _OPEN_READERS:
            _, oldest = self._readers.popitem(last=False)
            os.close(oldest)
        return fd

    def size_on_disk(self) -> int:
        """Bytes in every segment file."""
        return sum(
            (self.path / _segment_name(number)).stat().st_size for number in self._segment_numbers()
        )

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Close every file and release the directory; idempotent."""
        self._open = False
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        for name in ("_active_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    @property
    def closed(self) -> bool:
        return not self._open

    def require_open(self) -> None:
        if not self._open:
            raise StorageError(f"the trace store at {self.path} is closed; open a new one")

    def require_writable(self) -> int:
        """The active segment's descriptor; a closed or read-only log refuses."""
        self.require_open()
        if self._active_fd is None:
            raise StorageError(
                f"the trace store at {self.path} is open read-only (to read it while a run"
                " writes it); open it without read_only to write"
            )
        return self._active_fd
