"""Small, obviously correct storage implementations that the conformance suites run against.

The in-memory stores keep their state in a separate object, so that "reopening" builds a new
instance on the same state the way a file store reopens a directory. The two directory-backed
stores survive a killed process (not a power loss), which is enough for the crash tests.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from rllm_core.errors import ObjectNotFoundError
from rllm_core.storage.memory_objects import MemoryObjectStore as MemoryObjectStore
from rllm_core.types import BacklogStats, Sample, SampleBatch, Trace, TraceRecord


def check_key(key: str) -> str:
    """Return ``key`` when it is a valid object key, else raise ``ValueError``."""
    if not isinstance(key, str) or not key or key.startswith("/"):
        raise ValueError(f"invalid object key {key!r}: use a non-empty relative path")
    if any(part in ("", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}: empty and '..' segments are not allowed")
    return key


# --------------------------------------------------------------------------------------------
# Trace store
# --------------------------------------------------------------------------------------------


class MemoryTraceStore:
    """Records per session in append order; prompts rebuilt on every read, iteratively."""

    def __init__(self) -> None:
        self._sessions: dict[str, dict[str, TraceRecord]] = {}

    def append(self, record: TraceRecord) -> None:
        self._sessions.setdefault(record.session_id, {})[record.trace_id] = record

    def chain(self, session_id: str) -> list[TraceRecord]:
        records = self._sessions.get(session_id, {})
        return sorted(records.values(), key=lambda r: (r.lineage_id, r.turn))

    def session(self, session_id: str) -> list[Trace]:
        records = self._sessions.get(session_id, {})
        # trace_id -> (prompt, complete); an incomplete prompt holds what follows the gap.
        built: dict[str, tuple[list[int], bool]] = {}
        for trace_id in records:
            pending: list[TraceRecord] = []
            visited: set[str] = set()
            cursor: str | None = trace_id
            while cursor is not None and cursor not in built and cursor in records:
                if cursor in visited:
                    break
                visited.add(cursor)
                pending.append(records[cursor])
                cursor = records[cursor].parent_trace_id
            if cursor is None:
                prefix, complete = [], True
            elif cursor in built:
                prompt, complete = built[cursor]
                prefix = prompt + records[cursor].completion_token_ids
            else:
                prefix, complete = [], False
            for record in reversed(pending):
                prompt = prefix + record.prompt_delta_token_ids
                built[record.trace_id] = (prompt, complete)
                prefix = prompt + record.completion_token_ids
        return [
            Trace(
                record=r, prompt_token_ids=built[r.trace_id][0], chain_complete=built[r.trace_id][1]
            )
            for r in self.chain(session_id)
        ]

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def delete_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Sample buffers
# --------------------------------------------------------------------------------------------


@dataclass
class BufferState:
    samples: list[Sample] = field(default_factory=list)
    committed: int = -1


class MemorySampleBuffer:
    """A list of samples and a watermark; a new instance on the same state is a reopen."""

    def __init__(self, state: BufferState | None = None) -> None:
        self.state = state if state is not None else BufferState()
        self._lock = threading.Lock()

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        with self._lock:
            start = len(self.state.samples)
            stored = [msgspec.structs.replace(s, sequence=start + i) for i, s in enumerate(samples)]
            self._persist(stored)
            self.state.samples.extend(stored)
            return stored

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        with self._lock:
            chosen: list[Sample] = []
            watermark = self.committed()
            for sample in self.state.samples[self.committed() + 1 :]:
                if len(chosen) == max_samples:
                    break
                watermark = sample.sequence
                if sample.weight_version >= min_weight_version:
                    chosen.append(sample)
            return SampleBatch(samples=tuple(chosen), watermark=watermark)

    def commit(self, watermark: int) -> None:
        with self._lock:
            if watermark < self.committed():
                raise ValueError(
                    f"cannot commit {watermark}: {self.committed()} is already committed"
                )
            self._persist_watermark(watermark)
            self.state.committed = watermark

    def restore(self, watermark: int) -> None:
        with self._lock:
            if not -1 <= watermark < len(self.state.samples):
                raise ValueError(f"cannot restore {watermark}: {len(self.state.samples)} appended")
            self._persist_watermark(watermark)
            self.state.committed = watermark

    def committed(self) -> int:
        return self.state.committed

    def pending(self) -> int:
        return len(self.state.samples) - self.committed() - 1

    def backlog(self) -> BacklogStats:
        pending = self.state.samples[self.committed() + 1 :]
        return BacklogStats.of((s.group_id, s.weight_version) for s in pending)

    def close(self) -> None:
        pass

    def _persist(self, stored: list[Sample]) -> None:
        """Make ``stored`` durable before it becomes visible (nothing to do in memory)."""

    def _persist_watermark(self, watermark: int) -> None:
        """Make ``watermark`` durable before it becomes visible (nothing to do in memory)."""


class JsonlSampleBuffer(MemorySampleBuffer):
    """The memory buffer plus a JSON-lines log (one line per append) and a watermark file.

    A killed process can leave a partial last line: it was never acknowledged, so opening cuts
    it off.
    """

    def __init__(self, location: str) -> None:
        self.root = Path(location)
        self.root.mkdir(parents=True, exist_ok=True)
        self._log = self.root / "samples.jsonl"
        state = BufferState()
        if self._log.exists():
            data = self._log.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]
            if len(complete) != len(data):
                with open(self._log, "r+b") as handle:
                    handle.truncate(len(complete))
            for line in complete.splitlines():
                state.samples.extend(msgspec.json.decode(line, type=list[Sample]))
        mark = self.root / "committed"
        if mark.exists():
            state.committed = int(mark.read_text())
        super().__init__(state)

    def _persist(self, stored: list[Sample]) -> None:
        line = msgspec.json.encode(stored) + b"\n"
        fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _persist_watermark(self, watermark: int) -> None:
        temporary = self.root / f"committed.{uuid.uuid4().hex}"
        temporary.write_text(str(watermark))
        os.replace(temporary, self.root / "committed")


# --------------------------------------------------------------------------------------------
# Object stores
# --------------------------------------------------------------------------------------------


class DirectoryObjectStore:
    """One file per key under ``root/objects``; a put writes a temporary file and renames it
    into place, ``put_if_absent`` links it there (the link fails when the name exists, so
    one of several processes wins).
    """

    def __init__(self, location: str) -> None:
        self._objects = Path(location) / "objects"
        self._tmp = Path(location) / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, data: bytes) -> None:
        target = self._objects / check_key(key)
        temporary = self._tmp / uuid.uuid4().hex
        temporary.write_bytes(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temporary, target)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        target = self._objects / check_key(key)
        temporary = self._tmp / uuid.uuid4().hex
        temporary.write_bytes(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
        return True

    def get(self, key: str) -> bytes:
        try:
            return (self._objects / check_key(key)).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object under {key!r}") from None

    def exists(self, key: str) -> bool:
        return (self._objects / check_key(key)).is_file()

    def delete(self, key: str) -> None:
        (self._objects / check_key(key)).unlink(missing_ok=True)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        keys = (
            path.relative_to(self._objects).as_posix()
            for path in self._objects.rglob("*")
            if path.is_file()
        )
        return sorted(
            k for k in keys if k.startswith(prefix) and (start_after is None or k > start_after)
        )
