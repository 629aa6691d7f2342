"""The sample buffer a run uses when its plan names none: a list in memory.

It keeps the :class:`~rllm_core.ports.SampleBuffer` contract within one process, except that
nothing survives the process: a run that stops loses its queued samples, and a resumed run
samples them again. It drops samples once they are committed, so that a long run does not hold
every sample it trained on; ``restore`` can therefore move the watermark forwards but not back
below the committed one (a ``ValueError`` says so).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import msgspec

from rllm_core.types import BacklogStats, Sample, SampleBatch

__all__ = ["MemorySampleBuffer"]


class MemorySampleBuffer:
    """An in-memory :class:`~rllm_core.ports.SampleBuffer`; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unconsumed: deque[Sample] = deque()
        self._next_sequence = 0
        self._committed = -1

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        with self._lock:
            stored = [
                msgspec.structs.replace(sample, sequence=self._next_sequence + offset)
                for offset, sample in enumerate(samples)
            ]
            self._next_sequence += len(stored)
            self._unconsumed.extend(stored)
            return stored

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        with self._lock:
            watermark = self._committed
            chosen: list[Sample] = []
            for sample in self._unconsumed:
                if len(chosen) == max_samples:
                    break
                watermark = sample.sequence
                if sample.weight_version >= min_weight_version:
                    chosen.append(sample)
            return SampleBatch(samples=tuple(chosen), watermark=watermark)

    def commit(self, watermark: int) -> None:
        with self._lock:
            if watermark < self._committed:
                raise ValueError(
                    f"cannot commit watermark {watermark}: {self._committed} is already"
                    " committed and watermarks only move forward"
                )
            if watermark >= self._next_sequence:
                raise ValueError(
                    f"cannot commit watermark {watermark}: the last appended sample is"
                    f" {self._next_sequence - 1}; commit the watermark a select returned"
                )
            self._drop_through(watermark)

    def restore(self, watermark: int) -> None:
        """Set the committed watermark; below the committed one is a ``ValueError`` (those
        samples are gone)."""
        with self._lock:
            if watermark < self._committed:
                raise ValueError(
                    f"cannot restore the in-memory sample buffer to watermark {watermark}: it"
                    f" dropped the samples up to {self._committed} when they were committed;"
                    " use a durable sample buffer (file, or one in an object store) to rewind"
                )
            if watermark >= self._next_sequence:
                raise ValueError(
                    f"cannot restore watermark {watermark}: the last appended sample is"
                    f" {self._next_sequence - 1}"
                )
            self._drop_through(watermark)

    def committed(self) -> int:
        with self._lock:
            return self._committed

    def pending(self) -> int:
        with self._lock:
            return self._next_sequence - 1 - self._committed

    def backlog(self) -> BacklogStats:
        with self._lock:
            return BacklogStats.of((s.group_id, s.weight_version) for s in self._unconsumed)

    def close(self) -> None:
        """Nothing to release."""

    def _drop_through(self, watermark: int) -> None:
        while self._unconsumed and self._unconsumed[0].sequence <= watermark:
            self._unconsumed.popleft()
        self._committed = watermark
