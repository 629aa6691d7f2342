"""A sample buffer in an object store, shared by many writers and one reader.

:class:`ObjectStoreSampleBuffer` keeps the :class:`~rllm_core.ports.SampleBuffer` contract for
samplers on several processes or machines (the writers) and one trainer (the reader) that share
nothing but an :class:`~rllm_core.ports.ObjectStore`: a directory through the ``file`` store,
or a bucket through ``s3``.

Objects under ``prefix``:

- ``data/<writer>/<n>`` (``n`` zero-padded to 12 digits): the samples of one ``append`` call,
  written once by writer ``<writer>``, its ``n``-th append. The object is ``RLLMSBP1``, one
  codec byte (``0``: none, ``1``: zstandard) and the msgpack map ``{samples}``. Each writer has
  its own keys, so writers never contend on payloads.
- ``index/<position>`` (zero-padded to 12 digits): one small msgpack record per append, in the
  order appends were acknowledged: the writer, the payload's key, ``first_sequence`` and the
  weight version and group id of each sample. Positions run 0, 1, 2, ... without gaps, and each
  record's ``first_sequence`` is the previous record's ``first_sequence`` plus its sample
  count, so sequence numbers run from 0 without gaps in index order.
- ``committed``: the consumed watermark as JSON, ``{"watermark": 41, "position": 7}``
  (``position``: the first index position holding a sample after the watermark), overwritten
  by each ``commit`` and ``restore``.

**An append** puts the payload first, then takes the next free index position with
``put_if_absent``; of several writers racing for a position exactly one wins, and the others
learn the new end (``list`` with ``start_after`` their last known position) and try the
position after it with sequence numbers counted on from there. ``append`` returns once the index
record is stored: both objects are then durable (as durable as the store's ``put``). The order
matters: a position exists only once its samples do, so a writer killed at any point never
leaves a hole that the reader must wait on. A writer killed after its payload landed but before
it won a position leaves an unreferenced payload object (never delivered, and harmless); one
killed after it won a position has stored its samples, which the reader then delivers although
``append`` never returned to it.

**Missing payloads.** The rule above means an index record always names a stored payload, but
a payload can still be gone: deleted by hand or by a bucket lifecycle rule, or not yet visible
to this reader on a store that does not read its own writes across clients. A reader that meets
a position whose payload is missing delivers the positions before it and waits: later positions
are not delivered while it is unresolved, so that a watermark never passes samples that may
still arrive and ``commit(watermark)`` always means "everything up to here". It looks again on
each ``select`` until ``missing_payload_timeout_s`` have passed since it first saw the payload
missing, then claims the payload's key with a tombstone (``put_if_absent`` of ``RLLMSBX1...``):
if the claim wins, the position is skipped for good (by this and every later reader), its
samples are never delivered, the skip is logged with the key and counted in
:attr:`ObjectStoreSampleBuffer.skipped_positions`, and delivery continues after it; if the
claim loses, the payload arrived meanwhile and is delivered. A skipped position's sequence
numbers are never delivered, so they are the one gap a reader can see. ``pending()`` and
``backlog()`` exclude the skipped positions this reader knows of.

**The reader** keeps the index records after its watermark and the payloads it has read, and
drops them as it commits; each ``select`` lists only the index keys after the last one it knows
(``start_after``), so polling costs one ``list`` call and one ``get`` per new append. A reader
opening the buffer starts from the ``position`` stored with the committed watermark.
``restore(watermark)`` to below the positions it holds finds the position by a binary search
over index records.

**One reader.** Any number of instances may append, but one instance at a time should commit or
restore (the trainer); nothing stops two, and the last ``committed`` written wins. An instance
that has not committed or restored follows the ``committed`` object: it reads it again in each
``select``, ``committed``, ``pending`` and ``backlog`` call, so a sampler can watch the backlog.

Limits: payloads, index records and tombstones are never deleted (start a new prefix for a new
run); one ``append`` is one object, so it must fit the store's object size limit (5 GiB for a
single S3 put).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from rllm_core.errors import ObjectNotFoundError, StorageError
from rllm_core.types import BacklogStats, Sample, SampleBatch

if TYPE_CHECKING:
    from rllm_core.ports.storage import ObjectStore

    from rllm_sample_buffer_object_store.plugin import ObjectStoreSampleBufferConfig

__all__ = ["PAYLOAD_MAGIC", "SKIPPED_MAGIC", "ObjectStoreSampleBuffer"]

PAYLOAD_MAGIC = b"RLLMSBP1"
"""The first bytes of a payload object; a codec byte follows."""

SKIPPED_MAGIC = b"RLLMSBX1"
"""The first bytes of a tombstone: a reader gave up waiting for the payload under that key."""

_RAW, _ZSTD = 0, 1
_DIGITS = 12

log = logging.getLogger(__name__)


class _IndexRecord(msgspec.Struct, kw_only=True):
    writer: str
    payload: str
    first_sequence: int
    versions: list[int]
    groups: list[str]

    @property
    def count(self) -> int:
        return len(self.versions)

    @property
    def end(self) -> int:
        """The sequence after this record's last sample."""
        return self.first_sequence + len(self.versions)


class _Payload(msgspec.Struct, kw_only=True):
    samples: list[Sample]


class _Committed(msgspec.Struct, kw_only=True):
    watermark: int
    position: int = 0


class _Tombstone(msgspec.Struct, kw_only=True):
    position: int
    skipped_at: float


class ObjectStoreSampleBuffer:
    """A :class:`~rllm_core.ports.SampleBuffer` under ``prefix`` of ``store``; see the module
    docstring for the layout and the rules.

    ``writer`` names this instance's payload shard (one key segment, no ``/``); by default a
    random one. Two live instances may share a name (each payload key is created only once),
    but distinct names keep their appends from probing each other's keys. ``compress`` stores
    payloads zstandard-compressed (needs the ``zstandard`` package to write and to read them).
    ``clock`` measures ``missing_payload_timeout_s``. Thread-safe.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        writer: str | None = None,
        missing_payload_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        compress: bool = False,
    ) -> None:
        if prefix.endswith("/") or prefix.startswith("/"):
            raise ValueError(
                f"sample buffer prefix {prefix!r} must not start or end with '/'; write it"
                " like 'runs/r1/buffer'"
            )
        if writer is not None and (not writer or "/" in writer or writer in (".", "..")):
            raise ValueError(
                f"writer {writer!r} must be one non-empty key segment (no '/'), like 'sampler-0'"
            )
        if missing_payload_timeout_s < 0:
            raise ValueError(
                f"missing_payload_timeout_s must be 0 or more, got {missing_payload_timeout_s}"
            )
        self.store = store
        self.prefix = prefix
        self.writer = writer or uuid.uuid4().hex[:16]
        self.missing_payload_timeout_s = missing_payload_timeout_s
        self.compress = compress
        self._clock = clock
        self._encoder = msgspec.msgpack.Encoder()
        self._record_decoder = msgspec.msgpack.Decoder(_IndexRecord)
        self._payload_decoder = msgspec.msgpack.Decoder(_Payload)
        self._closed = False
        # Writer side, under _write_lock.
        self._write_lock = threading.Lock()
        self._tail: tuple[int, int] | None = None
        self._next_payload = 0
        # Reader side, under _read_lock.
        self._read_lock = threading.Lock()
        self._reading = False
        self._follows = True
        self._committed, self._base = self._load_committed()
        self._records: list[_IndexRecord] = []
        self._end_sequence: int | None = None
        self._payloads: dict[int, list[Sample]] = {}
        self._missing_since: dict[int, float] = {}
        self._skipped: set[int] = set()
        self._checked = False

    @classmethod
    def from_config(cls, config: ObjectStoreSampleBufferConfig) -> ObjectStoreSampleBuffer:
        """Build from the validated plan config (the component factory); the store is the
        run's ``[object_store]``."""
        if config.store is None:
            raise ValueError(
                "sample_buffer:object-store keeps its samples in the plan's [object_store];"
                ' add an [object_store] section (name = "file" or "s3")'
            )
        return cls(
            config.store,
            config.prefix,
            writer=config.writer,
            missing_payload_timeout_s=config.missing_payload_timeout_s,
            compress=config.compress,
        )

    # ---------------------------------------------------------------- keys

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts)) if self.prefix else "/".join(parts)

    def _index_key(self, position: int) -> str:
        return self._key("index", f"{position:0{_DIGITS}d}")

    def _payload_key(self, n: int) -> str:
        return self._key("data", self.writer, f"{n:0{_DIGITS}d}")

    def _index_prefix(self) -> str:
        return self._key("index") + "/"

    def _position_of_key(self, key: str) -> int:
        tail = key.rsplit("/", 1)[-1]
        if len(tail) != _DIGITS or not tail.isdigit():
            raise StorageError(
                f"{key!r} under the sample buffer index {self._index_prefix()!r} is not an"
                " index record; the index was modified outside the buffer, remove that object"
            )
        return int(tail)

    # ---------------------------------------------------------------- the port: writing

    def append(self, samples: Sequence[Sample]) -> list[Sample]:
        """Store ``samples`` as one payload, then take the next index position; they are
        durable, and numbered, on return."""
        self._require_open()
        if not samples:
            return []
        data = self._encode_payload(list(samples))
        with self._write_lock:
            payload_key = self._put_payload(data)
            record = _IndexRecord(
                writer=self.writer,
                payload=payload_key,
                first_sequence=0,
                versions=[s.weight_version for s in samples],
                groups=[s.group_id for s in samples],
            )
            position, record = self._take_position(record)
        stored = [
            msgspec.structs.replace(sample, sequence=record.first_sequence + i)
            for i, sample in enumerate(samples)
        ]
        with self._read_lock:
            # This instance also reads (one process both samples and trains): keep what it
            # just stored, so that its next select need not read it back.
            follows_on = self._end_sequence in (None, record.first_sequence)
            if self._reading and position == self._base + len(self._records) and follows_on:
                self._records.append(record)
                self._end_sequence = record.end
                self._payloads[position] = stored
        return stored

    def _put_payload(self, data: bytes) -> str:
        while True:
            key = self._payload_key(self._next_payload)
            if self.store.put_if_absent(key, data):
                self._next_payload += 1
                return key
            # An earlier instance with this writer name stored payloads here: skip past them.
            later = self.store.list(self._key("data", self.writer) + "/", start_after=key)
            self._next_payload = (
                self._position_of_key(later[-1]) + 1 if later else self._next_payload + 1
            )

    def _take_position(self, record: _IndexRecord) -> tuple[int, _IndexRecord]:
        position, first = self._tail or self._reader_tail() or self._find_tail()
        while True:
            record = msgspec.structs.replace(record, first_sequence=first)
            if self.store.put_if_absent(self._index_key(position), self._encoder.encode(record)):
                self._tail = (position + 1, record.end)
                return position, record
            position, first = self._catch_up(position)

    def _catch_up(self, position: int) -> tuple[int, int]:
        """The end of the index, knowing that ``position`` is taken."""
        after = self._index_key(position - 1) if position > 0 else None
        keys = self.store.list(self._index_prefix(), start_after=after)
        if not keys:
            raise StorageError(
                f"index position {position} under {self._index_prefix()!r} was taken, then"
                " vanished; the index was modified outside the buffer"
            )
        last = self._position_of_key(keys[-1])
        return last + 1, self._read_record(last).end

    def _reader_tail(self) -> tuple[int, int] | None:
        """The end of the index as this instance's reading side last saw it, if it read."""
        with self._read_lock:
            if self._end_sequence is None:
                return None
            return self._base + len(self._records), self._end_sequence

    def _find_tail(self) -> tuple[int, int]:
        """The first free position and its first sequence, by a galloping search over
        ``exists`` (a fresh writer on a long index makes a few dozen calls, not a full list)."""
        if not self.store.exists(self._index_key(0)):
            return 0, 0
        low, step = 0, 1
        while self.store.exists(self._index_key(low + step)):
            low, step = low + step, step * 2
        high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if self.store.exists(self._index_key(middle)):
                low = middle
            else:
                high = middle
        return low + 1, self._read_record(low).end

    # ---------------------------------------------------------------- the port: reading

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch:
        """The oldest samples after the watermark, skipping stale ones; consumes nothing. Stops
        before a position whose payload is missing (see the module docstring)."""
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        self._require_open()
        with self._read_lock:
            self._refresh()
            watermark = self._committed
            chosen: list[Sample] = []
            for offset, record in enumerate(self._records):
                position = self._base + offset
                if len(chosen) == max_samples:
                    break
                if position in self._skipped:
                    continue
                last, wanted = None, []
                for i in range(max(0, self._committed + 1 - record.first_sequence), record.count):
                    if len(chosen) + len(wanted) == max_samples:
                        break
                    last = i
                    if record.versions[i] >= min_weight_version:
                        wanted.append(i)
                if wanted:
                    samples = self._samples_at(position, record)
                    if samples is None:
                        if position in self._skipped:
                            continue
                        break
                    chosen.extend(samples[i] for i in wanted)
                if last is not None:
                    watermark = record.first_sequence + last
            return SampleBatch(samples=tuple(chosen), watermark=watermark)

    def commit(self, watermark: int) -> None:
        """Mark every sample up to ``watermark`` consumed, durably (the ``committed`` object)."""
        self._require_open()
        with self._read_lock:
            self._refresh()
            if watermark < self._committed:
                raise ValueError(
                    f"cannot commit watermark {watermark}: {self._committed} is already"
                    " committed and watermarks only move forward"
                )
            if watermark == self._committed:
                return
            end = self._known_end()
            if watermark >= end:
                raise ValueError(
                    f"cannot commit watermark {watermark}: the last appended sample is"
                    f" {end - 1}; commit the watermark a select returned"
                )
            self._store_committed(watermark)

    def restore(self, watermark: int) -> None:
        """Set the committed watermark, forwards or backwards, durably; see the port."""
        self._require_open()
        with self._read_lock:
            self._refresh()
            end = self._known_end()
            if not -1 <= watermark < end:
                raise ValueError(
                    f"cannot restore watermark {watermark}: it must lie between -1 and the last"
                    f" appended sample, {end - 1}"
                )
            if watermark < self._committed and (
                not self._records or watermark + 1 < self._records[0].first_sequence
            ):
                position = self._search_position(watermark + 1)
                self._base, self._records, self._end_sequence = position, [], None
                self._refresh()
            self._store_committed(watermark)

    def committed(self) -> int:
        self._require_open()
        with self._read_lock:
            self._follow()
            return self._committed

    def pending(self) -> int:
        """Samples after the watermark, stale ones and those of positions still waiting for
        their payload included, skipped positions not."""
        return self.backlog().samples

    def backlog(self) -> BacklogStats:
        self._require_open()
        with self._read_lock:
            self._refresh()
            return BacklogStats.of(self._pending_samples())

    @property
    def skipped_positions(self) -> int:
        """Index positions this instance skipped (or found skipped) because their payload
        stayed missing; their samples are never delivered."""
        with self._read_lock:
            return len(self._skipped)

    def close(self) -> None:
        """Nothing to flush (every append and commit was stored before it returned); later
        calls raise ``StorageError``. Idempotent."""
        self._closed = True

    def __enter__(self) -> ObjectStoreSampleBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ObjectStoreSampleBuffer({self.store!r}, {self.prefix!r}, writer={self.writer!r})"

    # ---------------------------------------------------------------- reader internals

    def _refresh(self) -> None:
        """Follow the committed object (see the module docstring), then read the index records
        appended since the last one this instance knows."""
        self._reading = True
        self._follow()
        last = self._base + len(self._records) - 1
        after = self._index_key(last) if last >= 0 else None
        for key in self.store.list(self._index_prefix(), start_after=after):
            position = self._position_of_key(key)
            if position != last + 1:
                raise StorageError(
                    f"the sample buffer index under {self._index_prefix()!r} jumps from"
                    f" position {last} to {position}; the index was modified outside the"
                    " buffer, restore the missing records or start a new prefix"
                )
            record = self._read_record(position)
            if self._end_sequence is not None and record.first_sequence != self._end_sequence:
                raise StorageError(
                    f"index record {key!r} starts at sequence {record.first_sequence} where"
                    f" {self._end_sequence} was expected; the index was modified outside the"
                    " buffer"
                )
            self._records.append(record)
            self._end_sequence = record.end
            last = position
        if not self._checked:
            self._check_committed()

    def _check_committed(self) -> None:
        """The index holds the committed watermark's next sample at the committed position,
        or ends just after the watermark there."""
        following = self._committed + 1
        if self._records:
            holds = self._records[0].first_sequence <= following < self._records[0].end
        elif self._base > 0:
            holds = self._read_record(self._base - 1).end == following
        else:
            holds = following == 0
        if not holds:
            raise StorageError(
                f"{self._key('committed')!r} says samples up to {self._committed} were"
                f" consumed (from index position {self._base}), but the index under"
                f" {self._index_prefix()!r} does not hold them; restore the index objects or"
                " start a new prefix"
            )
        self._checked = True

    def _known_end(self) -> int:
        """The sequence after the last sample this instance knows of."""
        if self._end_sequence is not None:
            return self._end_sequence
        return self._committed + 1

    def _follow(self) -> None:
        if not self._follows:
            return
        watermark, position = self._load_committed()
        if watermark == self._committed:
            return
        if watermark < self._committed:
            self._base, self._records, self._end_sequence = position, [], None
            self._payloads.clear()
            self._checked = False
        self._drop_through(watermark)

    def _load_committed(self) -> tuple[int, int]:
        key = self._key("committed")
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            return -1, 0
        try:
            committed = msgspec.json.decode(data, type=_Committed)
        except msgspec.DecodeError as exc:
            raise StorageError(
                f"{key!r} is not a sample buffer watermark ({exc}); delete that object,"
                " then restore the watermark the trainer's checkpoint holds with"
                " restore(watermark)"
            ) from exc
        return committed.watermark, committed.position

    def _store_committed(self, watermark: int) -> None:
        self._drop_through(watermark)
        data = msgspec.json.encode(_Committed(watermark=watermark, position=self._base))
        self.store.put(self._key("committed"), data)
        self._follows = False

    def _drop_through(self, watermark: int) -> None:
        """Set the watermark and forget the records and payloads it consumed."""
        self._committed = watermark
        drop = bisect.bisect_right(self._records, watermark, key=lambda r: r.end - 1)
        for position in range(self._base, self._base + drop):
            self._payloads.pop(position, None)
            self._missing_since.pop(position, None)
        del self._records[:drop]
        self._base += drop

    def _search_position(self, sequence: int) -> int:
        """The index position holding ``sequence`` (which exists), by binary search over the
        records from position 0 to the first one this instance holds."""
        low, high = 0, self._base + len(self._records)
        while high - low > 1:
            middle = (low + high) // 2
            if self._read_record(middle).first_sequence <= sequence:
                low = middle
            else:
                high = middle
        return low

    def _pending_samples(self) -> Iterator[tuple[str, int]]:
        for offset, record in enumerate(self._records):
            if self._base + offset in self._skipped:
                continue
            start = max(0, self._committed + 1 - record.first_sequence)
            yield from zip(record.groups[start:], record.versions[start:], strict=True)

    def _samples_at(self, position: int, record: _IndexRecord) -> list[Sample] | None:
        """The samples of ``position`` (numbered), or ``None`` while its payload is missing
        and once the position is skipped (then it is in ``_skipped``)."""
        cached = self._payloads.get(position)
        if cached is not None:
            return cached
        try:
            data = self.store.get(record.payload)
        except ObjectNotFoundError:
            now = self._clock()
            since = self._missing_since.setdefault(position, now)
            if now - since < self.missing_payload_timeout_s:
                if since == now:
                    log.info(
                        "sample buffer: the payload %s of index position %d is missing; waiting"
                        " up to %.1fs for it before skipping the position",
                        record.payload,
                        position,
                        self.missing_payload_timeout_s,
                    )
                return None
            tombstone = SKIPPED_MAGIC + self._encoder.encode(
                _Tombstone(position=position, skipped_at=time.time())
            )
            if self.store.put_if_absent(record.payload, tombstone):
                self._skip(position, record, waited=now - since)
                return None
            data = self.store.get(record.payload)
        if data.startswith(SKIPPED_MAGIC):
            self._skip(position, record, waited=None)
            return None
        samples = self._decode_payload(data, record)
        self._missing_since.pop(position, None)
        self._payloads[position] = samples
        return samples

    def _skip(self, position: int, record: _IndexRecord, *, waited: float | None) -> None:
        self._skipped.add(position)
        log.warning(
            "sample buffer: skipping index position %d (sequences %d..%d, writer %s): its"
            " payload %s %s; those samples are never delivered",
            position,
            record.first_sequence,
            record.end - 1,
            record.writer,
            record.payload,
            "was skipped by an earlier reader"
            if waited is None
            else f"stayed missing for {waited:.1f}s",
        )

    def _read_record(self, position: int) -> _IndexRecord:
        key = self._index_key(position)
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            raise StorageError(
                f"index record {key!r} was listed but cannot be read; the index was modified"
                " outside the buffer"
            ) from None
        try:
            return self._record_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise StorageError(
                f"{key!r} is not a sample buffer index record ({exc}); was it written by a"
                " newer rllm-core?"
            ) from exc

    # ---------------------------------------------------------------- payloads

    def _encode_payload(self, samples: list[Sample]) -> bytes:
        body = self._encoder.encode(_Payload(samples=samples))
        if not self.compress:
            return PAYLOAD_MAGIC + bytes([_RAW]) + body
        return PAYLOAD_MAGIC + bytes([_ZSTD]) + _zstandard().ZstdCompressor().compress(body)

    def _decode_payload(self, data: bytes, record: _IndexRecord) -> list[Sample]:
        codec = data[len(PAYLOAD_MAGIC) : len(PAYLOAD_MAGIC) + 1]
        if not data.startswith(PAYLOAD_MAGIC) or codec not in (bytes([_RAW]), bytes([_ZSTD])):
            raise StorageError(
                f"{record.payload!r} is not a sample buffer payload (it starts with"
                f" {data[:9]!r}); was it written by a newer rllm-core?"
            )
        body = data[len(PAYLOAD_MAGIC) + 1 :]
        if codec == bytes([_ZSTD]):
            body = _zstandard().ZstdDecompressor().decompress(body)
        try:
            samples = self._payload_decoder.decode(body).samples
        except msgspec.DecodeError as exc:
            raise StorageError(
                f"{record.payload!r} is not a readable sample buffer payload ({exc})"
            ) from exc
        if [s.weight_version for s in samples] != record.versions:
            raise StorageError(
                f"{record.payload!r} holds {len(samples)} samples that do not match its index"
                f" record ({record.count} samples from sequence {record.first_sequence}); the"
                " object was replaced outside the buffer"
            )
        return [
            msgspec.structs.replace(sample, sequence=record.first_sequence + i)
            for i, sample in enumerate(samples)
        ]

    def _require_open(self) -> None:
        if self._closed:
            raise StorageError(f"the sample buffer under {self.prefix!r} is closed; open a new one")


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise StorageError(
            "compressed sample buffer payloads need the zstandard package; pip install zstandard"
        ) from exc
    return zstandard
