"""The ``deltachain`` trace store: delta-chain records in append-only segment files.

Each :meth:`~DeltaChainTraceStore.append` writes one frame (see
:mod:`rllm_trace_store_deltachain.segments` for the files and
:mod:`rllm_trace_store_deltachain.codec` for the bytes); nothing is ever rewritten. A replay (a
record whose ``trace_id`` the session already has) is a new frame that wins over the old one;
:meth:`~DeltaChainTraceStore.delete_session` writes a tombstone, so a deletion survives reopening.

In memory the store keeps an index, rebuilt by reading every frame's uncompressed head on open:
for each session, each trace's location, head, write order and *base* (the frame its parent had
when it was written), and a bounded cache of the tails recently written records leave for their
children (:mod:`rllm_trace_store_deltachain.context`). Reads decode the session's frames, each with
the context it was written with, and rebuild prompts with
:func:`~rllm_trace_store_deltachain.rebuild.rebuild_prompts`.

Snapshots (``snapshot_every=K`` > 0): a record whose chain reaches ``K`` records below its root
or the last snapshot is stored with its full prompt and compressed alone, so that
:meth:`~DeltaChainTraceStore.trace` decodes at most ``K`` records. A snapshot is a cache of what
its ancestors said when it was written, so it is used only while no record of the session has
been replaced since; a replay makes the session's older snapshots fall back to their chains
(never to stale tokens) until new snapshots are written.

Reading a live store: :meth:`~DeltaChainTraceStore.open_read_only` opens the directory of a
store another process is writing (``rllm-core traces show`` on a run still going). It takes no
lock and never writes, creates or truncates a file; it sees the records complete when it was
opened, and a record still being written (or torn by a crash) is skipped, not cut.

Limits: space held by replaced records and deleted sessions is not reclaimed; one process opens
a directory for writing at a time.
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

from rllm_trace_store_deltachain.codec import (
    Decoded,
    Encoded,
    EntryCodec,
    RecordHead,
    SegmentTable,
    Tombstone,
)
from rllm_trace_store_deltachain.context import MIN_CONTEXT_TOKENS, TailCache, extend_tail
from rllm_trace_store_deltachain.packing import count_ids, join_ids, pack_ids, unpack_ids
from rllm_trace_store_deltachain.rebuild import order_key, rebuild_prompts, to_traces
from rllm_trace_store_deltachain.segments import Location, SegmentLog

if TYPE_CHECKING:
    from rllm_trace_store_deltachain.plugin import DeltaChainConfig

__all__ = ["DeltaChainTraceStore"]

log = logging.getLogger(__name__)

TAIL_CACHE_TOKENS = 1 << 22
"""Tokens of written tails kept for the next appends (4 bytes each: 16 MiB at most), enough for
the next turn of 2,048 sessions with full tails."""


@dataclass(slots=True, eq=False)
class _Frame:
    location: Location
    order: int
    head: RecordHead
    base: _Frame | None
    """The frame of this record's parent when it was written; ``None`` for a root or when the
    parent had not been written yet."""

    @property
    def starts_tail(self) -> bool:
        """Whether this frame's tail needs no other frame (a root, or a snapshot)."""
        return self.head.has_snapshot or self.head.parent_trace_id is None


@dataclass(slots=True)
class _Session:
    entries: dict[str, _Frame] = field(default_factory=dict)
    last_replaced: int = -1
    """Write order of the latest entry that replaced another; older snapshots are stale."""

    def snapshot_is_current(self, frame: _Frame) -> bool:
        return frame.head.has_snapshot and frame.order >= self.last_replaced


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
        read_only: bool = False,
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
        self._table = SegmentTable()
        self._table_segment = -1
        self._tails = TailCache(TAIL_CACHE_TOKENS)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._writes = 0
        self._log = SegmentLog(
            self.path, segment_bytes=segment_bytes, fsync=fsync, read_only=read_only
        )
        self._log.open(self._index)
        self._follow_segment(self._log.active_segment)

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

    @classmethod
    def open_read_only(cls, config: DeltaChainConfig) -> DeltaChainTraceStore:
        """Open the store of ``config.path`` to read it, also while a run appends to it: no
        lock, no file created, written or truncated (see the module docstring). ``append``
        and ``delete_session`` then raise :class:`~rllm_core.errors.StorageError`; so does a
        missing directory."""
        return cls(
            config.path,
            snapshot_every=config.snapshot_every,
            segment_bytes=config.segment_bytes,
            compression_level=config.compression_level,
            read_only=True,
        )

    @property
    def read_only(self) -> bool:
        """Whether the store was opened to read only."""
        return self._log.read_only

    # ---------------------------------------------------------------- the index

    def _follow_segment(self, segment: int) -> None:
        """Code heads against ``segment``'s table from now on (a new segment's is empty)."""
        if segment != self._table_segment:
            self._table.reset()
            self._table_segment = segment

    def _index(self, location: Location, payload: bytes) -> None:
        self._follow_segment(location.segment)
        try:
            head = self._codec.decode_head(payload, self._table)
        except (msgspec.DecodeError, ValueError) as exc:
            raise StorageError(
                f"{self.path}: segment {location.segment}, byte {location.offset}: the record is"
                f" intact but not a trace-store entry ({exc}); was it written by a newer"
                " rllm-trace-store-deltachain?"
            ) from exc
        if isinstance(head, Tombstone):
            self._forget(head.session_id)
        else:
            self._remember(head, location)

    def _remember(self, head: RecordHead, location: Location) -> _Frame:
        session = self._sessions.setdefault(head.session_id, _Session())
        base = None
        if head.parent_trace_id is not None:
            base = session.entries.get(head.parent_trace_id)
        if head.trace_id in session.entries:
            session.last_replaced = self._writes
        frame = _Frame(location, self._writes, head, base)
        session.entries[head.trace_id] = frame
        self._writes += 1
        return frame

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
            self._log.require_writable()
            session = self._sessions.get(record.session_id)
            base = None
            if session is not None and record.parent_trace_id is not None:
                base = session.entries.get(record.parent_trace_id)
            reader = _ChainReader(self)
            snapshot = None
            if self.snapshot_every and session is not None:
                snapshot = self._snapshot_for(record, session, reader)
            base_tail = self._base_tail(base, reader) if base is not None else None
            context = None
            if (
                snapshot is None
                and base_tail is not None
                and count_ids(base_tail) >= MIN_CONTEXT_TOKENS
            ):
                context = base_tail
            encoded = self._encode(record, snapshot, context)
            if self._log.needs_new_segment(len(encoded.entry)):
                self._log.start_segment()
                self._follow_segment(self._log.active_segment)
                encoded = self._encode(record, snapshot, context)
            location = self._log.append(encoded.entry)
            self._table.note(record.session_id, record.lineage_id, record.trace_id)
            self._remember(
                RecordHead(
                    session_id=record.session_id,
                    trace_id=record.trace_id,
                    parent_trace_id=record.parent_trace_id,
                    lineage_id=record.lineage_id,
                    turn=record.turn,
                    has_snapshot=snapshot is not None,
                    has_context=encoded.has_context,
                ),
                location,
            )
            if snapshot is not None:
                completion = join_ids([encoded.tokens], last=len(record.completion_token_ids))
                tail = extend_tail(None, snapshot, completion)
            elif record.parent_trace_id is None or base_tail is not None:
                tail = extend_tail(base_tail, encoded.tokens)
            else:
                return
            self._tails.put(location, tail)

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
            records, snapshots = self._read_ancestry(session, trace_id, _ChainReader(self))
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
            self._log.require_writable()
            if session_id not in self._sessions:
                return
            payload = self._codec.encode_tombstone(session_id)
            if self._log.needs_new_segment(len(payload)):
                self._log.start_segment()
                self._follow_segment(self._log.active_segment)
            self._log.append(payload)
            self._forget(session_id)

    def close(self) -> None:
        """Close the files and release the directory; idempotent. Appends were written
        already."""
        with self._lock:
            self._log.close()
            self._tails.clear()

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

    def _encode(
        self, record: TraceRecord, snapshot: bytes | None, context: bytes | None
    ) -> Encoded:
        return self._codec.encode_record(record, self._table, snapshot=snapshot, context=context)

    def _decode(self, frame: _Frame, context: bytes | None) -> Decoded:
        location = frame.location
        payload = self._log.read(location)
        try:
            return self._codec.decode_record(payload, frame.head, context)
        except (msgspec.DecodeError, zstandard.ZstdError, ValueError) as exc:
            raise StorageError(
                f"{self.path}: segment {location.segment}, byte {location.offset}: the record"
                f" passes its checksum but cannot be decoded ({exc}); was it written by a newer"
                " rllm-trace-store-deltachain?"
            ) from exc

    def _read_session(self, session_id: str) -> tuple[dict[str, TraceRecord], dict[str, bytes]]:
        self._log.require_open()
        session = self._sessions.get(session_id)
        if session is None:
            return {}, {}
        reader = _ChainReader(self)
        records: dict[str, TraceRecord] = {}
        snapshots: dict[str, bytes] = {}
        # Write order decodes every base before the frames compressed against it.
        for frame in sorted(session.entries.values(), key=lambda f: f.order):
            trace_id = frame.head.trace_id
            decoded = reader.decode(frame)
            records[trace_id] = decoded.record
            if decoded.snapshot is not None and session.snapshot_is_current(frame):
                snapshots[trace_id] = decoded.snapshot
        return records, snapshots

    def _read_ancestry(
        self, session: _Session, trace_id: str, reader: _ChainReader
    ) -> tuple[dict[str, TraceRecord], dict[str, list[int]]]:
        """The records of ``trace_id`` and its ancestors up to the first that needs no parent
        (a root or a current snapshot), a missing one or a loop, with the current snapshots
        among them."""
        path: list[_Frame] = []
        seen: set[str] = set()
        cursor: str | None = trace_id
        while cursor is not None and cursor not in seen:
            frame = session.entries.get(cursor)
            if frame is None:
                break
            path.append(frame)
            seen.add(cursor)
            if session.snapshot_is_current(frame):
                break
            cursor = frame.head.parent_trace_id
        records: dict[str, TraceRecord] = {}
        snapshots: dict[str, list[int]] = {}
        for frame in reversed(path):
            decoded = reader.decode(frame)
            records[frame.head.trace_id] = decoded.record
            if decoded.snapshot is not None and session.snapshot_is_current(frame):
                snapshots[frame.head.trace_id] = unpack_ids(decoded.snapshot)
        return records, snapshots

    def _snapshot_for(
        self, record: TraceRecord, session: _Session, reader: _ChainReader
    ) -> bytes | None:
        """The full prompt of ``record``, packed, when it is ``snapshot_every`` or more records
        below its base and its chain is complete; else ``None``."""
        if record.parent_trace_id is None or record.parent_trace_id not in session.entries:
            return None
        depth, seen = 0, set()
        cursor: str | None = record.parent_trace_id
        while cursor is not None and cursor not in seen and depth < self.snapshot_every:
            frame = session.entries.get(cursor)
            if frame is None:
                break
            depth += 1
            seen.add(cursor)
            if session.snapshot_is_current(frame):
                break
            cursor = frame.head.parent_trace_id
        if depth < self.snapshot_every or record.trace_id in seen:
            return None
        try:
            records, snapshots = self._read_ancestry(session, record.parent_trace_id, reader)
        except StorageError as exc:
            # A damaged ancestor costs this record its snapshot, not the append.
            log.warning("no snapshot for trace %s: %s", record.trace_id, exc)
            return None
        if record.trace_id in records:
            return None
        records[record.trace_id] = record
        prompt, complete = rebuild_prompts(records, snapshots)[record.trace_id]
        return pack_ids(prompt) if complete else None

    def _base_tail(self, base: _Frame, reader: _ChainReader) -> bytes | None:
        """The tail ``base`` leaves for its children: from the cache of recent appends, else
        decoded from disk (once per chain after reopening); ``None`` when it is unknown."""
        tail = self._tails.get(base.location)
        if tail is not None:
            return tail
        try:
            tail = reader.tail(base)
        except StorageError as exc:
            log.warning("trace %s is compressed without its context: %s", base.head.trace_id, exc)
            return None
        if tail is not None:
            self._tails.put(base.location, tail)
        return tail


class _ChainReader:
    """Decodes frames of one store, each with the context it was written with, for the length of
    one call. Memoizes decoded frames and tails, so that every frame is decoded at most once."""

    def __init__(self, store: DeltaChainTraceStore) -> None:
        self._store = store
        self._decoded: dict[Location, Decoded] = {}
        self._tails: dict[Location, bytes | None] = {}

    def decode(self, frame: _Frame) -> Decoded:
        """The record in ``frame``."""
        decoded = self._decoded.get(frame.location)
        if decoded is None:
            context = None
            if frame.head.has_context and frame.base is not None:
                context = self.tail(frame.base)
            decoded = self._store._decode(frame, context)
            self._decoded[frame.location] = decoded
        return decoded

    def tail(self, frame: _Frame) -> bytes | None:
        """The tail ``frame`` leaves for its children, ``None`` when it is unknown."""
        path: list[_Frame] = []
        cursor: _Frame | None = frame
        while cursor is not None and cursor.location not in self._tails:
            cached = self._store._tails.get(cursor.location)
            if cached is not None:
                self._tails[cursor.location] = cached
                break
            path.append(cursor)
            if cursor.starts_tail:
                break
            cursor = cursor.base
        # Oldest first: each frame's base tail is known by the time the frame needs it.
        for item in reversed(path):
            decoded = self.decode(item)
            base_tail = None
            if not item.starts_tail and item.base is not None:
                base_tail = self._tails.get(item.base.location)
            if item.head.has_snapshot and decoded.snapshot is not None:
                completion = len(decoded.record.completion_token_ids)
                tail = extend_tail(
                    None, decoded.snapshot, join_ids([decoded.tokens], last=completion)
                )
            elif item.head.parent_trace_id is None or base_tail is not None:
                tail = extend_tail(base_tail, decoded.tokens)
            else:
                tail = None
            self._tails[item.location] = tail
        return self._tails[frame.location]
