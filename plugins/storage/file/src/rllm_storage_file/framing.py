"""The sample log's file header; the frame format itself is :mod:`rllm_core.storage.framing`."""

from __future__ import annotations

from rllm_core.storage.framing import FRAME_HEADER, CorruptLogError, FrameReader, encode_frame

__all__ = ["FRAME_HEADER", "MAGIC", "CorruptLogError", "FrameReader", "encode_frame"]

MAGIC = b"RLLMSBL1"
