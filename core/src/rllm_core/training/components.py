"""From a plan file to a run's live components.

:func:`prepare_plan` loads and resolves a plan for a run, filling the keys a run can fill
itself: a trace store's (or sample buffer's, object store's) ``path`` goes inside the run
folder, a renderer's ``tokenizer`` is the trainer's model folder, and the trainer's
``logprob_temperature`` is ``[sampling].temperature`` (recomputed logprobs must match the
sampler's). :func:`build_components` builds them; :meth:`Components.aclose` closes them.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import load_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plan.schema import COMPONENT_SECTIONS, ComponentRef
from rllm_core.plugins.manager import PluginManager, get_plugin_manager

__all__ = ["BuildError", "Components", "build_components", "prepare_plan"]

STORE_SECTIONS = ("trace_store", "sample_buffer", "object_store")
"""Sections whose ``path`` defaults to a folder of the same name inside the run folder."""


class BuildError(Exception):
    """A component's factory failed; the message names the plan section and the plugin."""


def _ref(ref: ComponentRef, **extra: Any) -> ComponentRef:
    return ComponentRef.model_validate({"name": ref.name, **ref.options, **extra})


def _config_fields(manager: PluginManager, section: str, name: str) -> dict[str, Any]:
    try:
        return dict(manager.get_record(COMPONENT_SECTIONS[section], name).spec.config.model_fields)
    except Exception:
        return {}


def _trainer_model_dir(manager: PluginManager, ref: ComponentRef) -> Path | None:
    """The trainer's model folder when its config names a ``model``; raises
    :class:`~rllm_core.errors.ModelError` when the model is not cached."""
    from rllm_core.models import resolve_model

    try:
        spec = manager.get_record(COMPONENT_SECTIONS["trainer"], ref.name).spec
        config = spec.validate_config(ref.options)
    except Exception:
        return None
    model = getattr(config, "model", None)
    return resolve_model(model) if isinstance(model, str) else None


def prepare_plan(
    plan_path: str | Path,
    overrides: Sequence[str],
    *,
    run_dir: Path,
    manager: PluginManager | None = None,
) -> ResolvedPlan:
    """Load, fill (see the module docstring) and resolve a plan for a run in ``run_dir``.

    Raises :class:`~rllm_core.errors.PlanError` and, when the trainer's model is not cached,
    :class:`~rllm_core.errors.ModelNotCachedError`.
    """
    manager = manager or get_plugin_manager()
    plan, _ = load_plan(plan_path, overrides)
    updates: dict[str, Any] = {}
    for section in STORE_SECTIONS:
        ref = getattr(plan, section)
        if ref is None or "path" in ref.options:
            continue
        if "path" in _config_fields(manager, section, ref.name):
            updates[section] = _ref(ref, path=str(run_dir / section.replace("_store", "s")))
    trainer = plan.trainer
    if trainer is not None:
        fields = _config_fields(manager, "trainer", trainer.name)
        if "logprob_temperature" in fields and plan.sampling.temperature > 0:
            updates["trainer"] = _ref(trainer, logprob_temperature=plan.sampling.temperature)
        if "seed" in fields and "seed" not in trainer.options:
            updates["trainer"] = _ref(updates.get("trainer", trainer), seed=plan.run.seed)
    renderer = plan.renderer
    if (
        renderer is not None
        and trainer is not None
        and "tokenizer" not in renderer.options
        and "tokenizer" in _config_fields(manager, "renderer", renderer.name)
    ):
        folder = _trainer_model_dir(manager, trainer)
        if folder is not None:
            updates["renderer"] = _ref(renderer, tokenizer=str(folder))
    if updates:
        plan = plan.model_copy(update=updates)
    return resolve_plan(plan, manager=manager, path=str(plan_path))


@dataclass
class Components:
    """The built components of a run (``sandbox`` is None when the plan selects none)."""

    trainer: Any
    renderer: Any
    harness: Any
    tasks: Any
    trace_store: Any
    loss: Any
    advantage: Any
    sandbox: Any = None
    aux_losses: list[tuple[Any, float]] = field(default_factory=list)
    built: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close every component that has ``close`` (sync or async), newest first."""
        for instance in reversed(self.built):
            close = getattr(instance, "close", None)
            if not callable(close):
                continue
            result = close()
            if inspect.isawaitable(result):
                await result


def build_components(resolved: ResolvedPlan, *, on_built: Any = None) -> Components:
    """Build every component of ``resolved``; a failing factory raises :class:`BuildError`
    after closing what was already built."""
    built: dict[str, Any] = {}
    order: list[Any] = []
    try:
        for component in resolved:
            try:
                instance = component.build()
            except Exception as exc:
                raise BuildError(
                    f"{component.where}: building {component.kind.value}:{component.name}"
                    f" ({component.provider}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            built[component.where] = instance
            order.append(instance)
            if on_built is not None:
                on_built(component)
    except BuildError:
        for instance in reversed(order):
            close = getattr(instance, "close", None)
            if callable(close) and not inspect.iscoroutinefunction(close):
                close()
        raise
    aux = [
        (built[c.where], float(c.coef if c.coef is not None else 0.0))
        for c in resolved
        if c.where.startswith("[algorithm].aux_losses")
    ]
    return Components(
        trainer=built["[trainer]"],
        renderer=built["[renderer]"],
        harness=built["[harness]"],
        tasks=built["[tasks]"],
        trace_store=built["[trace_store]"],
        loss=built["[algorithm].loss"],
        advantage=built["[algorithm].advantage"],
        sandbox=built.get("[sandbox]"),
        aux_losses=aux,
        built=order,
    )
