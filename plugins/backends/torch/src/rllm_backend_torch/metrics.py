"""Combine per-micro-batch loss metrics into per-call figures."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

__all__ = ["MetricAccumulator"]


class MetricAccumulator:
    """Per-call metrics from per-micro-batch ones.

    ``add_sum`` adds to a total (losses, token counts). ``add_means`` records micro-batch means
    with its weight (the tokens the loss reduced over); the result is the weighted mean, or the
    plain mean of the values when every weight was 0.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._weighted: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)
        self._plain: dict[str, list[float]] = defaultdict(list)

    def add_sum(self, name: str, value: float) -> None:
        self._sums[name] += value

    def add_means(self, prefix: str, values: Mapping[str, float], weight: float) -> None:
        for key, value in values.items():
            name = f"{prefix}/{key}"
            self._weighted[name] += float(value) * weight
            self._weights[name] += weight
            self._plain[name].append(float(value))

    def result(self) -> dict[str, float]:
        out = dict(self._sums)
        for name, values in self._plain.items():
            weight = self._weights[name]
            out[name] = self._weighted[name] / weight if weight > 0 else sum(values) / len(values)
        return out
