"""Contracts for the trace store, the sample buffer and the object store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rllm_core.types import BacklogStats, Sample, SampleBatch, Trace, TraceRecord

__all__ = ["ObjectStore", "SampleBuffer", "TraceStore"]


@runtime_checkable
class TraceStore(Protocol):
    """Stores gateway traces as delta chains.

    Contract:

    - ``append(record)`` stores one record; appending a record whose ``trace_id`` exists
      replaces it (a replayed request overwrites in place).
    - ``session(session_id)`` returns every trace of the session with full prompts rebuilt
      byte-exactly, sorted by ``lineage_id`` (as a string) then ``turn``; records sharing a
      turn (forks) come in a stable order, the same in ``session`` and ``chain``. Records may
      have landed in any order. A record whose ancestor is missing comes back with
      ``chain_complete=False``; nothing is fabricated. Unknown sessions return ``[]``.
    - ``chain(session_id)`` returns the stored records as they are (compact form), same order;
      ``[]`` for an unknown session.
    - ``sessions()`` lists session ids; ``delete_session`` removes one (a no-op if absent).
    - ``close()`` flushes; what ``append`` returned for survives a restart.

    Example::

        store.append(record)
        for trace in store.session("s-1"):
            print(trace.record.turn, len(trace.prompt_token_ids))
    """

    def append(self, record: TraceRecord) -> None: ...

    def session(self, session_id: str) -> list[Trace]: ...

    def chain(self, session_id: str) -> list[TraceRecord]: ...

    def sessions(self) -> list[str]: ...

    def delete_session(self, session_id: str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SampleBuffer(Protocol):
    """A durable queue of training samples between the sampler side and the trainer.

    Contract:

    - ``append(samples)`` assigns each sample the next ``sequence`` number (the first is 0)
      and returns the stored samples. Once it returns, they survive a crash (kill -9) of the
      process.
    - ``select(max_samples, min_weight_version)`` returns the oldest samples after the committed
      watermark, skipping (and counting as stale) those sampled by a policy older than
      ``min_weight_version``. It does not consume: calling it twice returns the same batch.
      ``watermark`` is the sequence of the last sample considered; on an empty selection it
      equals ``committed()``.
    - ``commit(watermark)`` marks everything up to it consumed, durably. Committing backwards is
      a ``ValueError``; committing the current watermark again does nothing. ``committed()``
      returns the current watermark (``-1`` when nothing was committed).
    - ``restore(watermark)`` sets the committed watermark to ``watermark``, forwards or
      backwards, durably: every sample after it is selected again and none up to it. This is
      how a trainer resumes from a checkpoint that recorded the watermark. A watermark below
      ``-1`` or past the last appended sample is a ``ValueError`` (and so is one below what
      the buffer still holds, for a buffer that drops consumed samples; say so in its
      documentation).
    - ``pending()`` counts the appended samples after the committed watermark, stale ones
      included; ``backlog()`` describes those same samples
      (:class:`~rllm_core.types.BacklogStats`: ``samples == pending()``, their distinct
      groups, the oldest weight version among them and a count per weight version).
    - A new instance opened on the same location sees the same samples and watermark.

    Example::

        buffer.append(samples)
        batch = buffer.select(max_samples=64, min_weight_version=version - 1)
        train(batch.samples)
        buffer.commit(batch.watermark)
        # after a restart, from the checkpoint: buffer.restore(checkpoint.buffer_watermark)
    """

    def append(self, samples: Sequence[Sample]) -> list[Sample]: ...

    def select(self, max_samples: int, min_weight_version: int = 0) -> SampleBatch: ...

    def commit(self, watermark: int) -> None: ...

    def restore(self, watermark: int) -> None: ...

    def committed(self) -> int: ...

    def pending(self) -> int: ...

    def backlog(self) -> BacklogStats: ...

    def close(self) -> None: ...


@runtime_checkable
class ObjectStore(Protocol):
    """Bytes under string keys: policy releases, checkpoint cuts, shared run state.

    Contract:

    - Keys are ``/``-separated relative paths of non-empty segments, none of them ``.`` or
      ``..``, free of NUL characters, each segment at most 255 bytes of UTF-8; an invalid key
      (``""``, ``"/abs"``, ``"a//b"``, ``"a/"``, ``"a/../b"``) raises ``ValueError``
      (:func:`rllm_core.storage.keys.check_key` applies these rules).
    - ``put(key, data)`` stores atomically, replacing any object under ``key``: readers see
      the old or the new bytes, never a mix. Once it returns, the object survives a crash.
    - ``put_if_absent(key, data)`` creates the object only when no object is stored under
      ``key``. It returns ``True`` when this call created it (durable on return, as ``put``)
      and ``False`` when the key already existed, in which case nothing is written. Of several
      writers racing for one key (threads, processes or machines) exactly one gets ``True``,
      and the stored bytes are that writer's.
    - ``get(key)`` returns the bytes or raises ``ObjectNotFoundError``; ``exists(key)`` never
      raises for a missing key; ``delete(key)`` of a missing key is a no-op.
    - ``list(prefix, start_after)`` returns, sorted, the keys that start with ``prefix`` (a
      plain string prefix: ``"a"`` matches ``"ab"`` and ``"a/b"``) and, when ``start_after``
      is given, sort strictly after it (``start_after`` need not be a stored key). Keys sort
      by their code points, which is also the order of their UTF-8 bytes.
    - Failures of the backend itself (unreachable, refused, out of space) raise
      ``StorageError`` naming the key and what to do.

    Example::

        if not store.put_if_absent("runs/r1/cuts/000010.json", payload):
            raise RuntimeError("another trainer already wrote cut 10")
        newer = store.list("runs/r1/cuts/", start_after="runs/r1/cuts/000010.json")
    """

    def put(self, key: str, data: bytes) -> None: ...

    def put_if_absent(self, key: str, data: bytes) -> bool: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]: ...
