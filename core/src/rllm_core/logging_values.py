"""Which metric values and event fields a logger can write, and how: the rules every logger
plugin shares, so that the same record reads the same in every destination.

- :func:`metric_number`: ints, floats, bools and scalar objects with an ``item()`` method (numpy
  and torch scalars) become a float; anything else (a string, a list, a tensor with several
  elements, an int too large for a float) is ``None``, and the logger skips it. ``nan`` and
  ``inf`` stay as they are: what the destination makes of them is the logger's to document.
- :func:`event_json`: ``{"event": name, **fields}`` as one line of compact JSON (no spaces,
  non-ASCII text as it is). A field is kept when it is a JSON value: ``None``, a bool, an int,
  a float, a string, a list or tuple, or a mapping with string keys, nested to any depth, with
  scalar objects (``item()``) as their Python value. Any other field (an object, a set, bytes,
  a mapping with a non-string key anywhere inside) is skipped as a whole, as is a field named
  ``event`` (the ``event`` key holds the event's name) or whose name is not a string. ``nan``
  and ``inf`` become ``null`` at any depth.

For fields that are JSON values the line is the one the ``jsonl`` logger writes, so an event
reads the same in every destination that stores it as text. The helpers never raise for a value
they cannot represent. Standard library only: a plugin's entry module may import this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["event_json", "metric_number", "metric_scalar"]


def metric_scalar(value: Any) -> int | float | None:
    """``value`` as a Python int or float (bools stay bools, scalar objects give their
    ``item()``), or ``None`` when it is not a number."""
    if isinstance(value, (int, float)):
        return value
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    try:
        value = item()
    except Exception:  # a tensor with several elements, or a broken scalar type
        return None
    return value if isinstance(value, (int, float)) else None


def metric_number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when it is not a number (see the module docstring)."""
    scalar = metric_scalar(value)
    if scalar is None:
        return None
    try:
        return float(scalar)
    except OverflowError:
        return None


def event_json(name: str, fields: Mapping[str, Any]) -> str:
    """The event as one compact JSON object, skipping fields that cannot be encoded (see the
    module docstring)."""
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
