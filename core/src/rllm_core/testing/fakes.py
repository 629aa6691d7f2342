"""Hand-written fake distributions, for testing discovery without installing anything.

A fake distribution is a ``<name>-<version>.dist-info`` folder (METADATA + entry_points.txt)
plus module files, in a directory put on ``sys.path``. ``importlib.metadata`` finds it exactly
as it finds an installed package.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rllm_core.plugins.hookspecs import PROJECT_NAME

__all__ = ["FakeDistribution", "write_fake_distribution"]


@dataclass(frozen=True)
class FakeDistribution:
    name: str
    version: str
    root: Path
    modules: tuple[str, ...]


def write_fake_distribution(
    root: Path,
    name: str,
    *,
    version: str = "1.0.0",
    entry_points: Mapping[str, str] | None = None,
    modules: Mapping[str, str] | None = None,
) -> FakeDistribution:
    """Write a fake distribution under ``root``.

    ``entry_points`` maps entry-point names to module paths in the ``rllm_core`` group;
    ``modules`` maps dotted module names to their source (dedented).
    """
    root.mkdir(parents=True, exist_ok=True)
    dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    lines = [f"[{PROJECT_NAME}]"] + [
        f"{ep} = {target}" for ep, target in (entry_points or {}).items()
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    written = []
    for module, source in (modules or {}).items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.parents:
            if parent == root:
                break
            init = parent / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        written.append(module)
    return FakeDistribution(name=name, version=version, root=root, modules=tuple(written))


def forget_modules(names: tuple[str, ...]) -> None:
    """Drop fake modules from ``sys.modules`` so the next test imports them afresh."""
    for module in names:
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[loaded]
    importlib.invalidate_caches()
