"""The ``tensorboard`` logger: TensorBoard event files written with tensorboard's own writer.

``log_metrics(3, {"reward/mean": 0.41})`` adds one event at step 3 holding a scalar summary per
metric, tagged with the metric's name (slashes group the charts: ``reward/mean`` sits in the
``reward`` section). ``log_event("checkpoint", {"path": "ckpt-3"})`` adds a text summary tagged
``event/checkpoint`` whose text is ``{"event":"checkpoint","path":"ckpt-3"}`` (the line the
``jsonl`` logger writes), at the step of the latest ``log_metrics`` call (0 before the first).
The file is flushed after every call, so a killed run loses nothing it logged.

What it writes:

- Metric values must be numbers: ints, floats, bools and numpy or torch scalars; anything else
  is skipped. They are stored as 32-bit floats, TensorBoard's scalar format: ``0.41`` reads back
  as ``0.4099999964``, and a value beyond about ``3.4e38`` as ``inf``.
- ``nan`` and ``inf`` are written as they are; TensorBoard shows them.
- Event fields follow the ``jsonl`` logger's rules (see :mod:`rllm_core.logging_values`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm_core.logging_values import event_json, metric_number
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

if TYPE_CHECKING:
    from rllm_logger_tensorboard.plugin import TensorboardLoggerConfig

__all__ = ["TensorboardLogger"]


class TensorboardLogger:
    """A :class:`~rllm_core.ports.Logger` writing a new event file under ``path``. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._writer = EventFileWriter(str(self.path))
        self._lock = threading.Lock()
        self._closed = False
        self._step = 0

    @classmethod
    def from_config(cls, config: TensorboardLoggerConfig) -> TensorboardLogger:
        """Build from the validated plan config (the component factory)."""
        return cls(config.path)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write a scalar per metric at ``step``, skipping values that are not numbers."""
        summary = summary_pb2.Summary()
        for name, value in metrics.items():
            number = metric_number(value)
            if isinstance(name, str) and number is not None:
                summary.value.add(tag=name, simple_value=number)
        with self._lock:
            self._check_open()
            self._step = step
            if summary.value:
                event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
                self._writer.add_event(event)
                self._writer.flush()

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        """Write the event as text tagged ``event/<name>`` at the latest metrics step."""
        summary = text_pb(f"event/{name}", event_json(name, fields))
        with self._lock:
            self._check_open()
            event = event_pb2.Event(wall_time=time.time(), step=self._step, summary=summary)
            self._writer.add_event(event)
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._writer.close()

    def __enter__(self) -> TensorboardLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TensorboardLogger({str(self.path)!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(
                f"the tensorboard logger for {self.path} is closed; build a new one to log more"
            )
