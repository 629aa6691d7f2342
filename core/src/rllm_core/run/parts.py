"""What every part of an RL run works with, handed around as one value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rllm_core.plan import Plan, ResolvedPlan
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.run.observers import RunObservers

__all__ = ["RunParts"]


@dataclass
class RunParts:
    """The resolved plan, the built components, the run folder, what shows the run
    (``display``: replaced, every part shows on the new one) and the loggers and hooks."""

    resolved: ResolvedPlan
    components: Components
    folder: RunFolder
    display: Any
    observers: RunObservers

    @property
    def plan(self) -> Plan:
        return self.resolved.plan
