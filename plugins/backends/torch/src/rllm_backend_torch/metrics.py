"""Name losses and combine their per-micro-batch metrics into per-call figures."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

__all__ = ["MetricAccumulator", "loss_name"]


def loss_name(loss: Any) -> str:
    """The name metrics are prefixed with: the loss's ``name`` attribute when it has one, else
    the name of the installed component whose factory builds its class (``dppo-tv``), else its
    class name in kebab case."""
    name = getattr(loss, "name", None)
    if isinstance(name, str) and name:
        return name
    return _name_of_class(type(loss))


@functools.cache
def _name_of_class(cls: type) -> str:
    target = f"{cls.__module__}:{cls.__qualname__}"
    try:
        from rllm_core.plugins.manager import get_plugin_manager
        from rllm_core.plugins.specs import Kind

        for record in get_plugin_manager().components(Kind.LOSS):
            factory = record.spec.factory
            if factory is cls or getattr(factory, "target", None) == target:
                return record.spec.name
    except Exception:  # naming must never fail a training step
        pass
    kebab = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", cls.__name__)
    return kebab.lower()


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
