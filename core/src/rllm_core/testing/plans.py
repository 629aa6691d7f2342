"""Build plan files in tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from rllm_core.plan import ResolvedPlan, resolve_plan_file
from rllm_core.plugins.manager import PluginManager

__all__ = ["PlanBuilder"]


class PlanBuilder:
    """Writes plan.toml files into a folder and resolves them.

    Example::

        path = plan_builder.write({"algorithm": {"loss": "reinforce-tis"}})
        resolved = plan_builder.resolve({"algorithm": {"loss": "reinforce-tis"}})
    """

    def __init__(self, folder: Path, manager: PluginManager | None = None) -> None:
        self.folder = folder
        self.manager = manager
        self._count = 0

    def write(self, data: Mapping[str, Any], name: str | None = None) -> Path:
        self._count += 1
        path = self.folder / (name or f"plan-{self._count}.toml")
        path.write_text(tomli_w.dumps(dict(data)), encoding="utf-8")
        return path

    def resolve(self, data: Mapping[str, Any], overrides: Sequence[str] = ()) -> ResolvedPlan:
        return resolve_plan_file(self.write(data), overrides, manager=self.manager)
