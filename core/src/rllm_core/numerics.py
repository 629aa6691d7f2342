"""What a run's numbers depend on, and the process settings that make them repeatable.

``[run].deterministic = true`` (the default) promises that two runs of the same plan and seed,
on the same machine type with the same thread count and the same library versions, write the
same metrics and the same weights bit for bit, and that a stopped and resumed run equals one
that never stopped. Three parts keep that promise:

- :func:`prepare_environment`, called by ``rllm-core run`` and ``rllm-core eval`` before any
  component is built, puts :data:`REPRODUCIBLE_ENVIRONMENT` into the process environment.
  Numerical libraries read it when they initialise, which is at their first computation, and
  child processes inherit it; sandboxes, which start from a clean environment, get it through
  :func:`inherited_environment`.
- Components whose config has a ``deterministic`` key get ``[run].deterministic`` there and
  apply their library's own switches (the torch backend: deterministic algorithms).
- :func:`conditions` gathers what the result depends on; the run folder keeps it in
  :data:`NUMERICS_FILE` and, on resume, :func:`changed_conditions` names every condition that
  changed, since a resume on another machine type or thread count is not bitwise equal to an
  uninterrupted run.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, MutableMapping
from importlib import metadata
from pathlib import Path
from typing import Any

from rllm_core.ports.training import NumericsReport

__all__ = [
    "NUMERICS_FILE",
    "REPRODUCIBLE_ENVIRONMENT",
    "changed_conditions",
    "conditions",
    "inherited_environment",
    "prepare_environment",
]

REPRODUCIBLE_ENVIRONMENT: Mapping[str, str] = {
    "MKL_CBWR": "AUTO,STRICT",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
"""Environment variables set for a deterministic run, unless the user has set them already.

``MKL_CBWR``: Intel MKL (torch's CPU BLAS) picks code paths by memory alignment and CPU
unless its conditional numerical reproducibility is on; ``AUTO`` keeps the fastest path for
the CPU it runs on and ``STRICT`` makes the result independent of alignment. ``COMPATIBLE``
(the same result on every CPU) measured two to three times slower and is left to users who
need it: set it in the environment and the run keeps it. ``CUBLAS_WORKSPACE_CONFIG``: cuBLAS
is deterministic on CUDA 10.2 and later only with a fixed workspace, and torch's
deterministic algorithms refuse to run without it.
"""

NUMERICS_FILE = "numerics.json"


def prepare_environment(
    deterministic: bool, environ: MutableMapping[str, str] | None = None
) -> dict[str, str | None]:
    """With ``deterministic``, set each :data:`REPRODUCIBLE_ENVIRONMENT` variable the
    environment does not already hold. Returns every such variable's value now (None when
    unset), to record with the run."""
    env = os.environ if environ is None else environ
    if deterministic:
        for key, value in REPRODUCIBLE_ENVIRONMENT.items():
            env.setdefault(key, value)
    return {key: env.get(key) for key in REPRODUCIBLE_ENVIRONMENT}


def inherited_environment() -> dict[str, str]:
    """The :data:`REPRODUCIBLE_ENVIRONMENT` variables this process has, for a child process
    started with an environment of its own (a sandbox)."""
    return {key: os.environ[key] for key in REPRODUCIBLE_ENVIRONMENT if key in os.environ}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def conditions(deterministic: bool, components: Mapping[str, Any]) -> dict[str, Any]:
    """What this process's results depend on: the ``deterministic`` choice, the reproducibility
    environment, the machine and Python, and each component's own report (``components``
    maps a plan location such as ``"[trainer]"`` to a built component; those that implement
    :class:`~rllm_core.ports.NumericsReport` are asked)."""
    reports = {
        where: dict(component.numerics())
        for where, component in components.items()
        if isinstance(component, NumericsReport)
    }
    return {
        "deterministic": deterministic,
        "environment": {key: os.environ.get(key) for key in REPRODUCIBLE_ENVIRONMENT},
        "machine": {
            "cpu": _cpu_model(),
            "arch": platform.machine(),
            "logical_cpus": os.cpu_count(),
        },
        "python": platform.python_version(),
        "rllm-core": _version("rllm-core"),
        "components": reports,
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_conditions(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """One ``"key: before -> now"`` line per condition that differs (dotted keys)."""
    before, now = _flatten(recorded), _flatten(current)
    return [
        f"{key}: {before.get(key)!r} -> {now.get(key)!r}"
        for key in sorted(before.keys() | now.keys())
        if before.get(key) != now.get(key)
    ]
