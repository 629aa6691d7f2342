"""The ``jsonl`` logger: one JSON object per line, appended to a file.

``log_metrics(3, {"loss": 0.5})`` writes ``{"step":3,"loss":0.5}``; ``log_event("checkpoint",
{"path": "ckpt-3"})`` writes ``{"event":"checkpoint","path":"ckpt-3"}``. Each line is flushed
to the operating system as it is written, so a killed run loses nothing it logged; it is not
fsynced.

What it writes:

- Metric values must be numbers: ints and floats, bools, and scalar objects with an ``item()``
  method (numpy and torch scalars) are written; anything else (a string, a list, a tensor with
  more than one element) is skipped.
- Event fields may be any JSON value, including nested lists and mappings; a field that cannot
  be encoded is skipped as a whole.
- Non-finite floats (``nan``, ``inf``) are written as ``null``, wherever they are.
- The ``step`` and ``event`` keys always hold the call's step and event name: a metric or
  field of the same name is skipped, as is one whose name is not a string.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rllm_core.logging_values import metric_scalar

if TYPE_CHECKING:
    from rllm_logger_jsonl.plugin import JsonlLoggerConfig

__all__ = ["JsonlLogger"]


def _scalar_hook(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_scalar_hook)


class JsonlLogger:
    """A :class:`~rllm_core.ports.Logger` writing JSON lines to ``path``. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open until close()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: JsonlLoggerConfig) -> JsonlLogger:
        """Build from the validated plan config (the component factory)."""
        return cls(config.path)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write ``{"step": step, **metrics}``, skipping values that are not numbers."""
        parts = [b'"step":' + _encoder.encode(step)]
        for name, value in metrics.items():
            if name == "step" or not isinstance(name, str):
                continue
            encoded = _encode_number(value)
            if encoded is not None:
                parts.append(_encoder.encode(name) + b":" + encoded)
        self._write(parts)

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        """Write ``{"event": name, **fields}``, skipping fields that cannot be encoded."""
        parts = [b'"event":' + _encoder.encode(str(name))]
        for key, value in fields.items():
            if key == "event" or not isinstance(key, str):
                continue
            encoded = _encode_value(value)
            if encoded is not None:
                parts.append(_encoder.encode(key) + b":" + encoded)
        self._write(parts)

    def close(self) -> None:
        """Flush and close the file; idempotent."""
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> JsonlLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonlLogger({str(self.path)!r})"

    def _write(self, parts: list[bytes]) -> None:
        line = b"{" + b",".join(parts) + b"}\n"
        with self._lock:
            if self._file.closed:
                raise ValueError(
                    f"the jsonl logger for {self.path} is closed; build a new one to log more"
                )
            self._file.write(line)
            self._file.flush()


def _encode_number(value: Any) -> bytes | None:
    scalar = metric_scalar(value)
    return None if scalar is None else _encode_value(scalar)


def _encode_value(value: Any) -> bytes | None:
    try:
        return _encoder.encode(value)
    except Exception:  # any value msgspec cannot encode, or a scalar hook that failed
        return None
