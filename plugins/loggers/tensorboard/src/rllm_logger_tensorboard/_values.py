"""Which metric values and event fields a logger can write, and how.

- :func:`metric_number`: ints, floats, bools and scalar objects with an ``item()`` method (numpy
  and torch scalars) become a float; anything else (a string, a list, a tensor with several
  elements, an int too large for a float) is ``None``, and the logger skips it.
- :func:`event_json`: ``{"event": name, **fields}`` as compact JSON, the line the ``jsonl``
  logger writes. A field that is not a JSON value (after ``item()`` on scalars) is skipped as a
  whole; ``nan`` and ``inf`` become ``null`` at any depth; a field named ``event`` or whose name
  is not a string is skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["event_json", "metric_number"]


def metric_number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when it is not a number."""
    if not isinstance(value, (int, float)):
        item = getattr(value, "item", None)
        if not callable(item):
            return None
        try:
            value = item()
        except Exception:  # a tensor with several elements, or a broken scalar type
            return None
        if not isinstance(value, (int, float)):
            return None
    try:
        return float(value)
    except OverflowError:
        return None


def event_json(name: str, fields: Mapping[str, Any]) -> str:
    """The event as one compact JSON object, skipping fields that cannot be encoded."""
    record: dict[str, Any] = {"event": str(name)}
    for key, value in fields.items():
        if key == "event" or not isinstance(key, str):
            continue
        try:
            record[key] = _plain(value)
        except Exception:  # not a JSON value, a scalar hook that failed, or a cycle
            continue
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"cannot encode a {type(key).__name__} key")
            plain[key] = _plain(item)
        return plain
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    item = getattr(value, "item", None)
    if callable(item):
        scalar = item()
        if scalar is value:
            raise TypeError(f"cannot encode {type(value).__name__}")
        return _plain(scalar)
    raise TypeError(f"cannot encode {type(value).__name__}")
