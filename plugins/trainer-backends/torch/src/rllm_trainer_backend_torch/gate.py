"""Who may touch the policy weights, and which version they are.

Sampling and training share one module in one process. A completion must come from a single
weight version, and a training step must not see a half-decoded batch toggle modes under it,
so the two take turns: any number of sequences may be decoding at once (shared access), or the
trainer alone may compute gradients and update the weights (exclusive access). A waiting
trainer stops new sequences from starting, so sampling cannot starve it; sequences already
decoding finish first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["WeightGate"]


class WeightGate:
    """A readers-writer gate with writer preference and a weight version counter.

    - ``acquire_shared()`` / ``release_shared()``: held by the sampler for each sequence from
      admission until it finishes; the version read at admission names the weights that
      produce every token of it.
    - ``exclusive()``: held by the trainer around gradient computation and weight updates;
      waits for shared holders to finish and blocks new ones while waiting.
    - ``publish()``: called inside ``exclusive()`` after the weights changed; increments the
      version.
    """

    def __init__(self, version: int = 0) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_writers = 0
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Restore the counter (loading a checkpoint). Call inside ``exclusive()``."""
        with self._cond:
            self._version = version

    def acquire_shared(self, timeout: float | None = None) -> int:
        """Wait for shared access; returns the current weight version. Raises ``TimeoutError``."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: not self._exclusive and self._waiting_writers == 0, timeout
            ):
                raise TimeoutError("timed out waiting for the trainer to release the weights")
            self._shared += 1
            return self._version

    def try_acquire_shared(self) -> int | None:
        """Shared access without waiting, or ``None`` when the trainer holds or wants it."""
        with self._cond:
            if self._exclusive or self._waiting_writers:
                return None
            self._shared += 1
            return self._version

    def release_shared(self) -> None:
        with self._cond:
            if self._shared <= 0:
                raise RuntimeError("release_shared() without a matching acquire_shared()")
            self._shared -= 1
            if self._shared == 0:
                self._cond.notify_all()

    @property
    def trainer_waiting(self) -> bool:
        """True while the trainer holds or waits for exclusive access."""
        return self._exclusive or self._waiting_writers > 0

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting_writers -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def publish(self) -> int:
        """Increment the version (inside ``exclusive()``); returns the new version."""
        with self._cond:
            if not self._exclusive:
                raise RuntimeError("publish() outside exclusive(): take exclusive access first")
            self._version += 1
            return self._version
