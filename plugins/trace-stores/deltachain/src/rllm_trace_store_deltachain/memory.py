"""The ``memory`` trace store: delta chains in a dictionary, for tests and a gateway without a
trace directory.

Records are kept as given (not copied): do not mutate a record's lists after appending it.
Prompts are rebuilt on every read, so memory grows with the deltas, not with the full prompts.
Nothing survives the process.
"""

from __future__ import annotations

import threading

from rllm_core.errors import StorageError
from rllm_core.plugins import NoConfig
from rllm_core.types import Trace, TraceRecord

from rllm_trace_store_deltachain.rebuild import order_key, rebuild_prompts, to_traces

__all__ = ["MemoryTraceStore"]


class MemoryTraceStore:
    """A :class:`~rllm_core.ports.TraceStore` held in process memory. Thread-safe."""

    def __init__(self) -> None:
        self._sessions: dict[str, dict[str, TraceRecord]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_config(cls, config: NoConfig) -> MemoryTraceStore:
        """Build from the validated plan config (the component factory)."""
        return cls()

    def append(self, record: TraceRecord) -> None:
        """Store ``record``; one with the same ``trace_id`` in its session is replaced."""
        if not isinstance(record, TraceRecord):
            raise TypeError(f"append takes a TraceRecord, got {type(record).__name__}")
        with self._lock:
            self._require_open()
            self._sessions.setdefault(record.session_id, {})[record.trace_id] = record

    def session(self, session_id: str) -> list[Trace]:
        """Every trace of the session with its full prompt, in lineage and turn order."""
        with self._lock:
            self._require_open()
            records = dict(self._sessions.get(session_id, {}))
        prompts = rebuild_prompts(records)
        return to_traces(sorted(records.values(), key=order_key), prompts)

    def trace(self, session_id: str, trace_id: str) -> Trace | None:
        """One trace with its full prompt, or ``None`` when the session has no such trace."""
        with self._lock:
            self._require_open()
            records = self._sessions.get(session_id, {})
            path: dict[str, TraceRecord] = {}
            cursor: str | None = trace_id
            while cursor is not None and cursor in records and cursor not in path:
                path[cursor] = records[cursor]
                cursor = records[cursor].parent_trace_id
        if trace_id not in path:
            return None
        prompt, complete = rebuild_prompts(path)[trace_id]
        return Trace(record=path[trace_id], prompt_token_ids=prompt, chain_complete=complete)

    def chain(self, session_id: str) -> list[TraceRecord]:
        """The stored records as they are, in lineage and turn order."""
        with self._lock:
            self._require_open()
            return sorted(self._sessions.get(session_id, {}).values(), key=order_key)

    def sessions(self) -> list[str]:
        """Session ids with at least one trace, sorted."""
        with self._lock:
            self._require_open()
            return sorted(self._sessions)

    def delete_session(self, session_id: str) -> None:
        """Forget every trace of the session; a no-op when there is none."""
        with self._lock:
            self._require_open()
            self._sessions.pop(session_id, None)

    def close(self) -> None:
        """Drop every trace; idempotent."""
        with self._lock:
            self._closed = True
            self._sessions.clear()

    def _require_open(self) -> None:
        if self._closed:
            raise StorageError("the memory trace store is closed; build a new one")

    def __repr__(self) -> str:
        return f"MemoryTraceStore({len(self._sessions)} sessions)"
