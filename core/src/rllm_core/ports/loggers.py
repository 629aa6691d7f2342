"""Contract for run loggers (metrics sinks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Logger"]


@runtime_checkable
class Logger(Protocol):
    """Receives one metrics record per step and free-form events.

    Contract: ``log_metrics`` is called with strictly increasing ``step`` values; values are
    floats or ints. ``log_event`` records a named event with JSON-serializable fields.
    ``close`` flushes and is idempotent. A logger never raises for a value it cannot
    represent; it skips it.

    Example::

        logger.log_metrics(3, {"reward/mean": 0.41, "loss": 0.12})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3"})
    """

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...
