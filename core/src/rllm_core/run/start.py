"""What the entry points of ``rllm-core run`` and ``rllm-core sft`` share once the plan is
resolved and the run folder placed: the resume check, building components one by one, the
numerics record, and running a loop to its result.

A run that cannot go on as asked raises :class:`RunRefused`, whose message says why and what
to do and whose ``exit_code`` is what the command exits with (2 for a problem with what was
asked, 1 for one while running).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rllm_core.errors import RllmError
from rllm_core.numerics import conditions
from rllm_core.plan import ResolvedPlan
from rllm_core.run.components import LOGS_FOLDER, STORE_SECTIONS, BuildError
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import ResumeError, RunResult

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "RunRefused",
    "build_one",
    "check_same_plan",
    "comparable_plan",
    "record_numerics",
    "run_loop",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2


class RunRefused(RllmError):
    """The run cannot start or go on as asked; ``exit_code`` is the command's exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def comparable_plan(data: Mapping[str, Any], folder_name: str) -> dict[str, Any]:
    """The resolved plan of ``data`` as far as a resume must match it: ``run.steps`` and
    ``trainer.parallel.world_size`` (a checkpoint of several processes loads at any world size)
    may differ, and store and logger paths the run put in its folder may spell that folder
    differently (a relative path at the start, an absolute one to ``--resume``)."""
    plan = dict(data["plan"])
    plan["run"] = {k: v for k, v in plan.get("run", {}).items() if k != "steps"}
    trainer = plan.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("parallel"), dict):
        parallel = {k: v for k, v in trainer["parallel"].items() if k != "world_size"}
        plan["trainer"] = {k: v for k, v in trainer.items() if k != "parallel"}
        if parallel:
            plan["trainer"]["parallel"] = parallel
    for section in STORE_SECTIONS:
        ref = plan.get(section)
        if isinstance(ref, dict) and isinstance(ref.get("path"), str):
            path = Path(os.path.abspath(ref["path"]))
            if path.parent.name == folder_name:
                plan[section] = ref | {"path": f"<run folder>/{path.name}"}
    loggers = []
    for ref in plan.get("loggers", []):
        if isinstance(ref, dict) and isinstance(ref.get("path"), str):
            path = Path(os.path.abspath(ref["path"]))
            if path.parent.name == LOGS_FOLDER and path.parent.parent.name == folder_name:
                ref = ref | {"path": f"<run folder>/{LOGS_FOLDER}/{path.name}"}
        loggers.append(ref)
    if loggers:
        plan["loggers"] = loggers
    return plan


def check_same_plan(
    resolved: ResolvedPlan, folder: RunFolder, plan_path: Path, *, beyond: str = ""
) -> None:
    """Refuse to resume ``folder`` with a plan other than the one it was started with (as
    :func:`comparable_plan` compares them; ``beyond`` names what may differ)."""
    name = Path(os.path.abspath(folder.path)).name
    if comparable_plan(resolved.to_dict(), name) != comparable_plan(folder.read_resolved(), name):
        raise RunRefused(
            f"{plan_path} (with these --set values) differs from the plan {folder.path} was"
            f" started with{beyond}; resume with that plan: {folder.plan_file}",
            EXIT_USAGE,
        )


def build_one(resolved: ResolvedPlan, where: str, display: Any = None) -> Any:
    """Build the component at ``where`` (saying so on ``display``); :class:`RunRefused`
    naming the section and the plugin when its factory fails."""
    component = resolved.get(where)
    assert component is not None, where
    try:
        instance = component.build()
    except Exception as exc:
        raise RunRefused(
            str(
                BuildError(
                    f"{component.where}: building {component.kind.value}:{component.name}"
                    f" ({component.provider}) failed: {type(exc).__name__}: {exc}"
                )
            )
        ) from exc
    if display is not None:
        display.info(f"built {component.where}: {component.kind.value}:{component.name}")
    return instance


def record_numerics(
    folder: RunFolder, resolved: ResolvedPlan, placed: Mapping[str, Any], *, resume: bool
) -> str | None:
    """Record the numerical conditions of the run in ``folder``; a warning when a resumed
    run's differ from the ones it was started with."""
    current = conditions(resolved.plan.run.deterministic, placed)
    return folder.record_numerics(current, resume=resume)


def run_loop(
    run: Callable[[], Awaitable[RunResult]],
    folder: RunFolder,
    *,
    what: str,
    usage_errors: tuple[type[BaseException], ...] = (),
) -> RunResult:
    """Run a loop to its result on a new event loop; what stops it becomes
    :class:`RunRefused`: a :class:`~rllm_core.run.lifecycle.ResumeError` or one of
    ``usage_errors`` with exit status 2, anything else with 1, saying that the finished
    checkpoints are intact."""
    import asyncio

    try:
        return asyncio.run(run())
    except (ResumeError, *usage_errors) as exc:
        raise RunRefused(str(exc), EXIT_USAGE) from exc
    except Exception as exc:
        raise RunRefused(
            f"the {what} failed: {type(exc).__name__}: {exc}; finished checkpoints in"
            f" {folder.checkpoints} are intact"
        ) from exc
