"""Length- and checksum-framed records in an append-only log file.

Layout: a file header chosen by the log's owner (a magic string), then frames. A frame is the
payload length (4 bytes, little-endian), the CRC-32 of the payload (4 bytes, little-endian) and
the payload. An empty payload is never written, so a zero-filled region never reads as a frame.

A crash can only tear the frame being written, which is always the last one. :class:`FrameReader`
therefore treats a bad frame that reaches the end of the file as a torn tail (``end`` says where
the intact part stops) and a bad frame followed by more bytes as corruption it refuses to guess
about.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from rllm_core.errors import StorageError

__all__ = ["FRAME_HEADER", "MAX_PAYLOAD", "CorruptLogError", "FrameReader", "encode_frame"]

FRAME_HEADER = struct.Struct("<II")
MAX_PAYLOAD = 2**32 - 1


class CorruptLogError(StorageError):
    """A frame in the middle of a log fails its checksum: the file was damaged after it was
    written (not by a crash during an append)."""


def encode_frame(payload: bytes) -> bytes:
    """The bytes to append for one record."""
    if not payload:
        raise ValueError("a frame payload cannot be empty")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(
            f"a frame payload of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte limit;"
            " split the record into smaller ones"
        )
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class FrameReader:
    """Iterates ``(payload_offset, payload)`` over the frames of ``handle`` from ``start``.

    ``size`` is the file size to read up to. Once iteration stops, ``end`` is the offset just
    past the last intact frame and ``torn`` the number of bytes after it (a torn tail to cut).
    Raises :class:`CorruptLogError` for a damaged frame that is not at the end.
    """

    def __init__(self, handle: BinaryIO, size: int, start: int, *, name: str) -> None:
        self._handle = handle
        self._size = size
        self._name = name
        self.end = start

    @property
    def torn(self) -> int:
        return self._size - self.end

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        self._handle.seek(self.end)
        while self.end < self._size:
            offset = self.end
            header = self._handle.read(FRAME_HEADER.size)
            if len(header) < FRAME_HEADER.size:
                return
            length, checksum = FRAME_HEADER.unpack(header)
            frame_end = offset + FRAME_HEADER.size + length
            if length == 0 or frame_end > self._size:
                return
            payload = self._handle.read(length)
            if len(payload) < length:
                return
            if zlib.crc32(payload) != checksum:
                if frame_end == self._size:
                    return
                raise CorruptLogError(
                    f"{self._name}: the record at byte {offset} fails its checksum and"
                    f" {self._size - frame_end} bytes follow it, so the file was damaged"
                    f" after it was written; keep a copy, then truncate it to {offset} bytes to"
                    " drop that record and everything after it"
                )
            self.end = frame_end
            yield offset + FRAME_HEADER.size, payload
