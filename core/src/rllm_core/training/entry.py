"""The entry point of ``rllm-core run`` once its plan is resolved and its run folder placed:
build the components, record the numerics, wire the pipeline's halves for this process's
role and run them to the end."""

from __future__ import annotations

from typing import Any

from rllm_core.docs_site import docs_page
from rllm_core.plan import ResolvedPlan
from rllm_core.ports import ParallelTrainer
from rllm_core.rollout.gateway_address import GatewayBindError
from rllm_core.run.components import BuildError, build_components
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import RunResult
from rllm_core.run.runlog import RunLog
from rllm_core.run.start import EXIT_USAGE, RunRefused, record_numerics, run_loop

__all__ = ["check_parallel", "check_role", "train"]


def check_parallel(trainer: Any, resolved: ResolvedPlan, world_size: int) -> None:
    """Refuse a trainer that cannot train in the ``world_size`` processes torchrun started."""
    if not isinstance(trainer, ParallelTrainer):
        component = resolved.get("[trainer]")
        assert component is not None
        raise RunRefused(
            f"{resolved.path}: [trainer] {component.kind.value}:{component.name} does not"
            f" train in several processes (no ParallelTrainer), and torchrun started"
            f" {world_size}; run it in one process",
            EXIT_USAGE,
        )


def check_role(role: str, resolved: ResolvedPlan, node_class: str | None = None) -> None:
    """A split run's roles meet in an object store: refuse a role the plan cannot split, and
    ``node_class`` (``--node-class``) that names no class of the plan's nodes."""
    plan = resolved.plan
    nodes = plan.scheduler.nodes
    if nodes and role == "both":
        raise RunRefused(
            f"{resolved.path}: [scheduler].nodes lends a sampling node to the trainer, which"
            " takes a sampler and a trainer in separate processes: start the run with --role"
            " sampler and --role trainer",
            EXIT_USAGE,
        )
    if node_class is not None and node_class not in {node.node_class for node in nodes}:
        classes = sorted({node.node_class for node in nodes})
        raise RunRefused(
            f"{resolved.path}: --node-class {node_class}: "
            + (
                "no node of [scheduler].nodes has that class (their classes:"
                f" {', '.join(classes)}); name one of them"
                if classes
                else "the plan has no [scheduler].nodes to choose from; add them or drop the flag"
            ),
            EXIT_USAGE,
        )
    if role != "both" and (plan.object_store is None or plan.run.pipeline != "async"):
        guide = docs_page("running", "a-sampler-and-a-trainer-in-separate-processes")
        raise RunRefused(
            f"{resolved.path}: --role {role} shares the run with the other role through an"
            ' object store: the plan needs [run].pipeline = "async" and an [object_store]'
            f" section (see {guide})",
            EXIT_USAGE,
        )
    if role != "both" and plan.run.export is not None:
        raise RunRefused(
            f"{resolved.path}: [run].export = {plan.run.export!r} is written by the one-process"
            f" run, and --role {role} splits it; remove the key and export the run's last"
            " checkpoint when it has finished: rllm-core checkpoints export RUN_FOLDER --merge"
            " --out DIR",
            EXIT_USAGE,
        )


def train(
    resolved: ResolvedPlan,
    folder: RunFolder,
    *,
    display: Any,
    role: str = "both",
    world_size: int | None = None,
    resume: bool = False,
    record_datums: bool = False,
    warn: Any = None,
    incarnation: int | None = None,
    overrides: tuple[str, ...] = (),
    node_class: str | None = None,
) -> RunResult:
    """Train ``resolved`` into ``folder`` as ``role`` (``both``: the one-process loop;
    ``sampler`` / ``trainer``: one side of a split run); ``world_size`` when torchrun started
    this process as rank 0 of several. ``warn`` shows what the run notices before it starts
    (default: the display's warnings). A trainer runs as ``incarnation`` launched by a
    scheduler when given; ``overrides`` are the ``--set`` items a scheduling trainer passes on
    to the incarnations it launches; ``node_class`` limits the convertible nodes it converts
    to one class. Raises :class:`~rllm_core.run.start.RunRefused`."""
    warn = warn or display.warn
    run_log = RunLog(folder.log)
    try:
        try:
            components = build_components(
                resolved,
                on_built=lambda c: display.info(f"built {c.where}: {c.kind.value}:{c.name}"),
            )
        except BuildError as exc:
            raise RunRefused(str(exc)) from exc
        if world_size is not None:
            check_parallel(components.trainer, resolved, world_size)
        changed = record_numerics(folder, resolved, components.placed, resume=resume)
        if changed is not None:
            warn(changed)
        try:
            loop = _wire(
                role,
                resolved=resolved,
                components=components,
                folder=folder,
                display=display,
                resume=resume,
                record_datums=record_datums,
                **(
                    {"incarnation": incarnation, "overrides": overrides, "node_class": node_class}
                    if role == "trainer"
                    else {}
                ),
            )
        except BuildError as exc:  # a trainer launcher ([scheduler].launcher)
            raise RunRefused(str(exc)) from exc

        async def drive() -> RunResult:
            try:
                return await loop.run()
            finally:
                await components.aclose()

        return run_loop(drive, folder, what="run", usage_errors=(GatewayBindError,))
    finally:
        run_log.close()


def _wire(role: str, *, resume: bool, **parts: Any) -> Any:
    """The loop of this process's role over the pipeline's halves."""
    if role == "both":
        from rllm_core.training.loop import TrainingLoop

        return TrainingLoop(resume=resume, **parts)
    from rllm_core.training.roles import SamplerRole, TrainerRole
    from rllm_core.training.shared import SharedRun

    check_role(role, parts["resolved"], parts.get("node_class"))
    shared = SharedRun(parts["components"].object_store, parts["resolved"].plan.run.name)
    role_class = SamplerRole if role == "sampler" else TrainerRole
    return role_class(shared=shared, **parts)
