"""A count that goes up and down, and its mean over time."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Gauge"]


class Gauge:
    """A count (rollouts running, groups in flight) with its time-weighted mean since the
    last :meth:`take_mean`; ``clock`` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.value = 0
        self._since = self._changed = clock()
        self._area = 0.0

    def add(self, delta: int) -> None:
        now = self.clock()
        self._area += self.value * (now - self._changed)
        self._changed = now
        self.value += delta

    def take_mean(self) -> float:
        """The mean value since the previous call (or since the gauge was made); the current
        value when no time passed."""
        now = self.clock()
        area = self._area + self.value * (now - self._changed)
        elapsed = now - self._since
        self._since = self._changed = now
        self._area = 0.0
        return area / elapsed if elapsed > 0 else float(self.value)
