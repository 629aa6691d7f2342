"""The names a trainer prefixes loss metrics with (``dppo-tv/clip_frac``, ``echo-2/nll``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["loss_name", "unique_names"]


def loss_name(loss: Any) -> str:
    """The loss's ``name`` attribute when it has one, else the name of the installed loss
    component whose factory builds its class (``dppo-tv``), else its class name in kebab
    case."""
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
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", cls.__name__).lower()


def unique_names(names: Iterable[str]) -> list[str]:
    """Suffix repeated names (``echo``, ``echo-2``) so their metrics stay apart."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out
