"""Size strings such as ``"4G"`` or ``"512M"`` in task files, normalized to MiB."""

from __future__ import annotations

import math
import re

__all__ = ["parse_size_mb"]

_SIZE_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")

# Every unit is binary, as Docker reads ``--memory 4g``: a task written for Docker gets the
# same amount here.
_UNIT_MB = {
    "": 1.0,
    "b": 1.0 / (1 << 20),
    "k": 1.0 / 1024,
    "m": 1.0,
    "g": 1024.0,
    "t": 1024.0 * 1024.0,
}


def parse_size_mb(value: object) -> int:
    """Return ``value`` in MiB, rounded up to a whole MiB.

    A plain number (int, float or a digits-only string) is already MiB. A string may carry a
    unit, case-insensitive, optionally followed by ``i``, ``B`` or ``iB``: ``B``, ``K``, ``M``,
    ``G``, ``T`` (``512M``, ``512Mi``, ``512MB`` and ``512MiB`` are equal). All are powers of
    1024, so ``"1.5G"`` is 1536 and ``"2GB"`` is 2048. Raises ``ValueError`` naming the value
    when it is not a positive size.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; write a number of MiB or a string like '4G'")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(
                f"{value!r} is not a size; write a number of MiB or a string like '4G' or '512M'"
            )
        number = float(match["number"])
        unit = match["unit"].lower()
        if len(unit) > 1 and unit.endswith("b"):
            unit = unit[:-1]
        if len(unit) > 1 and unit.endswith("i"):
            unit = unit[:-1]
        if unit not in _UNIT_MB:
            raise ValueError(
                f"{value!r} has an unknown unit {match['unit']!r}; use K, M, G or T"
                " (optionally followed by B or iB)"
            )
    else:
        raise ValueError(
            f"{value!r} is not a size; write a number of MiB or a string like '4G' or '512M'"
        )
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{value!r} is not a positive size")
    return max(1, math.ceil(number * _UNIT_MB[unit] - 1e-9))
