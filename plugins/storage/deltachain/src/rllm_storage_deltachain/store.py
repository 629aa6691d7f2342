"""The ``deltachain`` trace store: delta-chain records in append-only segment files.

Each :meth:`~DeltaChainTraceStore.append` writes one frame (see
:mod:`rllm_storage_deltachain.segments` for the files and :mod:`rllm_storage_deltachain.codec`
for the bytes); nothing is ever rewritten. A replay (a record whose ``trace_id`` the session
already has) is a new frame that wins over the old one; :meth:`~DeltaChainTraceStore.delete_session`
writes a tombstone, so a deletion survives reopening.

In memory the store keeps only an index, rebuilt by reading every frame's uncompressed head on
open: for each session, each trace's location, parent, write order and whether it holds a
snapshot. Reads decode the session's frames and rebuild prompts with
:func:`~rllm_storage_deltachain.rebuild.rebuild_prompts`.

Snapshots (``snapshot_every=K`` > 0): a record whose chain reaches ``K`` records below its root
or the last snapshot is stored with its full prompt, so that :meth:`~DeltaChainTraceStore.trace`
decodes at most ``K`` records. A snapshot is a cache of what its ancestors said when it was
written, so it is used only while no record of the session has been replaced since; a replay
makes the session's older snapshots fall back to their chains (never to stale tokens) until new
snapshots are written.

Limits: space held by replaced records and deleted sessions is not reclaimed; one process opens
a directory at a time.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import zstandard
from rllm_core.errors import StorageError
from rllm_core.types import Trace, TraceRecord

from rllm_storage_deltachain.codec import EntryCodec, RecordHead, Tombstone, unpack_ids
from rllm_storage_deltachain.rebuild import order_key, rebuild_prompts, to_traces
from rllm_storage_deltachain.segments import Location, SegmentLog

if TYPE_CHECKING:
    from rllm_storage_deltachain.plugin import DeltaChainConfig

__all__ = ["DeltaChainTraceStore"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    location: Location
    order: int
    parent_trace_id: str | None
    has_snapshot: bool


@dataclass(slots=True)
class _Session:
    entries: dict[str, _Entry] = field(default_factory=dict)
    last_replaced: int = -1
    """Write order of the latest entry that replaced another; older snapshots are stale."""

    def snapshot_is_current(self, entry: _Entry) -> bool:
        return entry.has_snapshot and entry.order >= self.last_replaced


class DeltaChainTraceStore:
    """A :class:`~rllm_core.ports.TraceStore` in the directory ``path``. Thread-safe.

    ``fsync=False`` (the default) makes an acknowledged append survive a killed process but not
    a power loss; ``fsync=True`` adds an fdatasync to every append.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        snapshot_every: int = 0,
        segment_bytes: int = 64 * 1024 * 1024,
        compression_level: int = 3,
        fsync: bool = False,
    ) -> None:
        if snapshot_every < 0:
            raise ValueError(
                f"snapshot_every must be 0 (no snapshots) or a positive number of records,"
                f" got {snapshot_every}"
            )
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, got {segment_bytes}")
        if not 1 <= compression_level <= 22:
            raise ValueError(f"compression_level must be 1 to 22 (zstd), got {compression_level}")
        self.path = Path(path)
        self.snapshot_every = snapshot_every
        self.fsync = fsync
        self._codec = EntryCodec(compression_level)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._writes = 0
        self._log = SegmentLog(self.path, segment_bytes=segment_bytes, fsync=fsync)
        self._log.open(self._index)

    @classmethod
    def from_config(cls, config: DeltaChainConfig) -> DeltaChainTraceStore:
        """Build from the validated plan config (the component factory)."""
        return cls(
            config.path,
            snapshot_every=config.snapshot_every,
            segment_bytes=config.segment_bytes,
            compression_level=config.compression_level,
            fsync=config.fsync,
        )

    # ---------------------------------------------------------------- the index

    def _index(self, location: Location, payload: bytes) -> None:
        try:
            head = self._codec.decode_head(payload)
        except (msgspec.DecodeError, ValueError) as exc:
            raise StorageError(
                f"{self.path}: segment {location.segment}, byte {location.offset}: the record is"
                f" intact but not a trace-store entry ({exc}); was it written by a newer"
                " rllm-storage-deltachain?"
            ) from exc
        if isinstance(head, Tombstone):
            self._forget(head.session_id)
        else:
            self._remember(head, location)

    def _remember(self, head: RecordHead, location: Location) -> None:
        session = self._sessions.setdefault(head.session_id, _Session())
        if head.trace_id in session.entries:
            session.last_replaced = self._writes
        session.entries[head.trace_id] = _Entry(
            location, self._writes, head.parent_trace_id, head.has_snapshot
        )
        self._writes += 1

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._writes += 1

    # ---------------------------------------------------------------- the port

    def append(self, record: TraceRecord) -> None:
        """Write ``record``; it replaces an earlier one with the same ``trace_id`` in its
        session. Returns once the frame reached the operating system."""
        if not isinstance(record, TraceRecord):
            raise TypeError(f"append takes a TraceRecord, got {type(record).__name__}")
        with self._lock:
            self._log.require_open()
            snapshot = self._snapshot_for(record) if self.snapshot_every else None
            payload = self._codec.encode_record(record, snapshot)
            location = self._log.append(payload)
            self._remember(
                RecordHead(
                    session_id=record.session_id,
                    trace_id=record.trace_id,
                    parent_trace_id=record.parent_trace_id,
                    lineage_id=record.lineage_id,
                    turn=record.turn,
                    has_snapshot=snapshot is not None,
                ),
                location,
            )

    def session(self, session_id: str) -> list[Trace]:
        """Every trace of the session with its full prompt, in lineage and turn order."""
        with self._lock:
            records, snapshots = self._read_session(session_id)
        prompts = rebuild_prompts(records)
        if snapshots and not all(complete for _, complete in prompts.values()):
            # Only a damaged chain needs them: a current snapshot equals what its chain builds.
            prompts = rebuild_prompts(
                records, {trace_id: unpack_ids(data) for trace_id, data in snapshots.items()}
            )
        return to_traces(sorted(records.values(), key=order_key), prompts)

    def chain(self, session_id: str) -> list[TraceRecord]:
        """The stored records as they are, in lineage and turn order."""
        with self._lock:
            records, _ = self._read_session(session_id)
        return sorted(records.values(), key=order_key)

    def trace(self, session_id: str, trace_id: str) -> Trace | None:
        """One trace with its full prompt, or ``None`` when the session has no such trace.

        Decodes the trace's ancestors up to its root or the nearest current snapshot: at most
        ``snapshot_every`` records when snapshots are on and no replay made them stale.
        """
        with self._lock:
            self._log.require_open()
            session = self._sessions.get(session_id)
            if session is None or trace_id not in session.entries:
                return None
            path = self._ancestry(session, trace_id)
            records: dict[str, TraceRecord] = {}
            snapshots: dict[str, list[int]] = {}
            for ancestor in path:
                record, snapshot = self._decode(session.entries[ancestor].location)
                records[ancestor] = record
                if snapshot is not None and session.snapshot_is_current(session.entries[ancestor]):
                    snapshots[ancestor] = unpack_ids(snapshot)
        prompt, complete = rebuild_prompts(records, snapshots)[trace_id]
        return Trace(record=records[trace_id], prompt_token_ids=prompt, chain_complete=complete)

    def sessions(self) -> list[str]:
        """Session ids with at least one trace, sorted."""
        with self._lock:
            self._log.require_open()
            return sorted(self._sessions)

    def delete_session(self, session_id: str) -> None:
        """Delete every trace of the session with a tombstone; a no-op when there is none."""
        with self._lock:
            self._log.require_open()
            if session_id not in self._sessions:
                return
            self._log.append(self._codec.encode_tombstone(session_id))
            self._forget(session_id)

    def close(self) -> None:
        """Close the files and release the directory; idempotent. Appends were written
        already."""
        with self._lock:
            self._log.close()

    # ---------------------------------------------------------------- beyond the port

    def size_on_disk(self) -> int:
        """Bytes in the segment files."""
        with self._lock:
            return self._log.size_on_disk()

    def __enter__(self) -> DeltaChainTraceStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DeltaChainTraceStore({str(self.path)!r}, snapshot_every={self.snapshot_every},"
            f" fsync={self.fsync})"
        )

    # ---------------------------------------------------------------- helpers

    def _decode(self, location: Location) -> tuple[TraceRecord, bytes | None]:
        payload = self._log.read(location)
        try:
            return self._codec.decode_record(payload)
        except (msgspec.DecodeError, zstandard.ZstdError, ValueError) as exc:
            raise StorageError(
                f"{self.path}: segment {location.segment}, byte {location.offset}: the record"
                f" passes its checksum but cannot be decoded ({exc}); was it written by a newer"
                " rllm-storage-deltachain?"
            ) from exc

    def _read_session(self, session_id: str) -> tuple[dict[str, TraceRecord], dict[str, bytes]]:
        self._log.require_open()
        session = self._sessions.get(session_id)
        if session is None:
            return {}, {}
        records: dict[str, TraceRecord] = {}
        snapshots: dict[str, bytes] = {}
        for trace_id, entry in session.entries.items():
            records[trace_id], snapshot = self._decode(entry.location)
            if snapshot is not None and session.snapshot_is_current(entry):
                snapshots[trace_id] = snapshot
        return records, snapshots

    def _ancestry(self, session: _Session, trace_id: str) -> list[str]:
        """``trace_id`` and its ancestors up to the first that needs no parent (a root or a
        current snapshot), a missing one or a loop."""
        path: list[str] = []
        seen: set[str] = set()
        cursor: str | None = trace_id
        while cursor is not None and cursor not in seen:
            entry = session.entries.get(cursor)
            if entry is None:
                break
            path.append(cursor)
            seen.add(cursor)
            if session.snapshot_is_current(entry):
                break
            cursor = entry.parent_trace_id
        return path

    def _snapshot_for(self, record: TraceRecord) -> list[int] | None:
        """The full prompt of ``record`` when it is ``snapshot_every`` or more records below its
        base and its chain is complete; else ``None``."""
        if record.parent_trace_id is None:
            return None
        session = self._sessions.get(record.session_id)
        if session is None or record.parent_trace_id not in session.entries:
            return None
        path = self._ancestry(session, record.parent_trace_id)
        if len(path) < self.snapshot_every or record.trace_id in path:
            return None
        records: dict[str, TraceRecord] = {}
        snapshots: dict[str, list[int]] = {}
        try:
            for ancestor in path:
                entry = session.entries[ancestor]
                records[ancestor], snapshot = self._decode(entry.location)
                if snapshot is not None and session.snapshot_is_current(entry):
                    snapshots[ancestor] = unpack_ids(snapshot)
        except StorageError as exc:
            # A damaged ancestor costs this record its snapshot, not the append.
            log.warning("no snapshot for trace %s: %s", record.trace_id, exc)
            return None
        records[record.trace_id] = record
        prompt, complete = rebuild_prompts(records, snapshots)[record.trace_id]
        return prompt if complete else None
