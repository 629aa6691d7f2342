"""From a plan file to a run's live components.

:func:`prepare_plan` loads and resolves a plan for a run, filling the keys a run can fill
itself, each only where the component's spec lists it in its ``run_keys`` trait
(:mod:`rllm_core.plugins.run_keys`): a trace store's (or sample buffer's, object store's)
``path`` goes inside the run
folder, a sampler's ``weights_dir`` (where the trainer writes the weights its servers load) is
``<run folder>/weights``, a logger's required ``path`` is ``<run folder>/logs/<name>``
(``<name>-<index>`` when two ``[[loggers]]`` entries share a name), a renderer's ``tokenizer``
is the trainer's model folder, and the trainer's ``logprob_temperature`` is
``[sampling].temperature`` (recomputed logprobs must match the sampler's; a different value
written in the plan is replaced, with a note in ``ResolvedPlan.notes``), and its
``deterministic`` is ``[run].deterministic`` (replaced the same way), and its ``tokenizer`` (a
managed backend's bound on token ids) is the renderer's ``tokenizer``. The trainer's ``model`` is
resolved while preparing, so an uncached model fails before anything is built.
:func:`build_components` builds the components (``training=False`` for sampling only: no loss or
advantage needed); :meth:`Components.aclose` closes them."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rllm_core import ports
from rllm_core.errors import ComponentConflictError, UnknownComponentError
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import load_plan
from rllm_core.plan.resolve import SHARED_BUFFER, resolve_plan
from rllm_core.plan.schema import COMPONENT_SECTIONS, ComponentRef, Plan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.plugins.specs import ComponentSpec, Kind

__all__ = [
    "LOGS_FOLDER",
    "PROVISIONAL_TOTAL_STEPS",
    "SAMPLING_COMPONENTS",
    "TRAINING_COMPONENTS",
    "BuildError",
    "Components",
    "build_components",
    "fills_total_steps",
    "prepare_plan",
    "provisional_total_steps",
]

SAMPLING_COMPONENTS = ("[trainer]", "[renderer]", "[harness]", "[tasks]", "[trace_store]")
"""What sampling rollouts needs (``rllm-core eval``)."""

TRAINING_COMPONENTS = (*SAMPLING_COMPONENTS, "[algorithm].loss", "[algorithm].advantage")
"""What a training run needs."""

STORE_SECTIONS = ("trace_store", "sample_buffer", "object_store")
"""Sections whose ``path`` defaults to a folder of the same name inside the run folder."""

PROVISIONAL_TOTAL_STEPS = 2**31 - 1
"""``total_steps`` while the real length is not known yet (only the renderer is built then)."""

LOGS_FOLDER = "logs"
"""The folder of the run folder where a ``[[loggers]]`` entry's ``path`` defaults to."""


class BuildError(Exception):
    """A component's factory failed; the message names the plan section and the plugin."""


def _ref(ref: ComponentRef, **extra: Any) -> ComponentRef:
    return ComponentRef.model_validate({"name": ref.name, **ref.options, **extra})


def _spec(manager: PluginManager, kind: Kind, name: str) -> ComponentSpec | None:
    """The spec of ``kind:name``; ``None`` when no plugin or several provide it (resolving
    the plan reports that, naming the section)."""
    try:
        return manager.get_record(kind, name).spec
    except (UnknownComponentError, ComponentConflictError):
        return None


def _run_keys(manager: PluginManager, kind: Kind, name: str) -> tuple[str, ...]:
    """The keys the component ``kind:name`` accepts from the run (its spec's ``run_keys``
    trait, :mod:`rllm_core.plugins.run_keys`); none for a component that cannot be found."""
    spec = _spec(manager, kind, name)
    return tuple(spec.trait("run_keys")) if spec is not None else ()


def _accepts(manager: PluginManager, section: str, name: str, key: str) -> bool:
    return key in _run_keys(manager, COMPONENT_SECTIONS[section], name)


def _fetch_hub_models(
    manager: PluginManager, trainer: ComponentRef | None, renderer: ComponentRef | None
) -> None:
    """Download the Hub ids the trainer's ``model`` and the renderer's ``tokenizer`` name that
    are not in the Hugging Face cache (see :func:`rllm_core.models.hub.fetch_missing_hub_model`);
    a model the backend's service hosts (trait ``hosted_model``) is not downloaded."""
    import sys

    from rllm_core.models.hub import fetch_missing_hub_model

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if trainer is not None and isinstance(trainer.options.get("model"), str):
        try:
            hosted = manager.get_record(COMPONENT_SECTIONS["trainer"], trainer.name).spec.trait(
                "hosted_model"
            )
        except Exception:
            hosted = True
        if not hosted:
            fetch_missing_hub_model(trainer.options["model"], progress=say)
    if renderer is not None and isinstance(renderer.options.get("tokenizer"), str):
        fetch_missing_hub_model(
            renderer.options["tokenizer"],
            needs=("tokenizer.json", "tokenizer_config.json"),
            progress=say,
        )


def _trainer_model_dir(
    manager: PluginManager, ref: ComponentRef, *, require: bool = True
) -> str | None:
    """The trainer's model folder when its config names a ``model`` that lives on this
    machine (not one a backend with the trait ``hosted_model`` trains on its service); raises
    :class:`~rllm_core.errors.ModelError` when the model is not cached, or without ``require``
    returns the ``model`` as written (a name the renderer's tokenizer resolves the same way)."""
    from rllm_core.errors import ModelError
    from rllm_core.models import resolve_model

    try:
        spec = manager.get_record(COMPONENT_SECTIONS["trainer"], ref.name).spec
        if spec.trait("hosted_model"):
            return None
        config = spec.validate_config(ref.options)
    except Exception:
        return None
    model = getattr(config, "model", None)
    if not isinstance(model, str):
        return None
    try:
        return str(resolve_model(model))
    except ModelError:
        if require:
            raise
        return model


def fills_total_steps(plan: Plan, manager: PluginManager | None = None) -> bool:
    """Whether the trainer accepts ``total_steps`` from the run (its spec's ``run_keys``)
    and the plan leaves it unset."""
    if plan.trainer is None or "total_steps" in plan.trainer.options:
        return False
    manager = manager or get_plugin_manager()
    return "total_steps" in _run_keys(manager, Kind.TRAINER_BACKEND, plan.trainer.name)


def provisional_total_steps(
    plan: Plan, manager: PluginManager, plan_path: str
) -> tuple[ComponentRef, str] | None:
    """The trainer with :data:`PROVISIONAL_TOTAL_STEPS` and a note saying so, when
    :func:`fills_total_steps`; ``rllm-core sft`` resolves the plan again with the real value."""
    if plan.trainer is None or not fills_total_steps(plan, manager):
        return None
    ref = ComponentRef.model_validate(
        {"name": plan.trainer.name, **plan.trainer.options, "total_steps": PROVISIONAL_TOTAL_STEPS}
    )
    note = (
        f"{plan_path}: [trainer].total_steps is unset: `rllm-core sft` sets it to the run's"
        " optimizer steps ([sft].epochs x steps per epoch) once it has read the data; shown"
        f" here as {PROVISIONAL_TOTAL_STEPS}"
    )
    return ref, note


def prepare_plan(
    plan_path: str | Path,
    overrides: Sequence[str],
    *,
    run_dir: Path,
    manager: PluginManager | None = None,
    download: bool = False,
    require_models: bool = True,
) -> ResolvedPlan:
    """Load, fill (see the module docstring) and resolve a plan for a run in ``run_dir``.

    Raises :class:`~rllm_core.errors.PlanError` and, when the trainer's ``model`` is not
    cached, :class:`~rllm_core.errors.ModelNotCachedError` (naming ``rllm-core models pull``);
    :class:`~rllm_core.errors.ModelNotFoundError` when it names no model at all; without
    ``require_models`` (``plan check``, which reports those as findings) neither, and the
    renderer's ``tokenizer`` is then filled with the ``model`` as written. With
    ``download``, a Hub id the trainer's ``model`` or the renderer's ``tokenizer`` names that is
    not cached is downloaded first when the Hub may be reached (``HF_HUB_OFFLINE`` unset), and
    :class:`~rllm_core.errors.ModelPullError` says why when that fails.
    """
    manager = manager or get_plugin_manager()
    plan, _ = load_plan(plan_path, overrides, manager=manager)
    updates: dict[str, Any] = {}
    notes: list[str] = []
    for section in STORE_SECTIONS:
        ref = getattr(plan, section)
        if ref is None or "path" in ref.options:
            continue
        if _accepts(manager, section, ref.name, "path"):
            updates[section] = _ref(ref, path=str(run_dir / section.replace("_store", "s")))
    sampler = plan.sampler
    if (
        sampler is not None
        and "weights_dir" not in sampler.options
        and _accepts(manager, "sampler", sampler.name, "weights_dir")
    ):
        updates["sampler"] = _ref(sampler, weights_dir=str(run_dir / "weights"))
    shared = _shared_buffer(manager, plan)
    if shared is not None:
        updates["sample_buffer"] = shared
    loggers = _logger_paths(manager, plan.loggers, run_dir)
    if loggers != plan.loggers:
        updates["loggers"] = loggers
    trainer = plan.trainer
    if trainer is not None and plan.is_sft:
        filled = provisional_total_steps(plan, manager, str(plan_path))
        if filled is not None:
            trainer, note = filled
            updates["trainer"] = trainer
            notes.append(note)
    if download:
        _fetch_hub_models(manager, trainer, plan.renderer)
    model_folder = (
        _trainer_model_dir(manager, trainer, require=require_models)
        if trainer is not None
        else None
    )
    if trainer is not None:
        fields = _run_keys(manager, COMPONENT_SECTIONS["trainer"], trainer.name)
        if "logprob_temperature" in fields and plan.sampling.temperature > 0:
            updates["trainer"] = _ref(trainer, logprob_temperature=plan.sampling.temperature)
            written = trainer.options.get("logprob_temperature")
            if written is not None and written != plan.sampling.temperature:
                notes.append(
                    f"{plan_path}: [trainer].logprob_temperature: {written!r} is replaced by"
                    f" [sampling].temperature = {plan.sampling.temperature!r} (recomputed"
                    " logprobs must match the sampler's); remove the key"
                )
        if "seed" in fields and "seed" not in trainer.options:
            updates["trainer"] = _ref(updates.get("trainer", trainer), seed=plan.run.seed)
        if "deterministic" in fields:
            written = trainer.options.get("deterministic")
            if written is not None and written != plan.run.deterministic:
                notes.append(
                    f"{plan_path}: [trainer].deterministic: {written!r} is replaced by"
                    f" [run].deterministic = {str(plan.run.deterministic).lower()} (one switch"
                    " for the whole run); remove the key"
                )
            updates["trainer"] = _ref(
                updates.get("trainer", trainer), deterministic=plan.run.deterministic
            )
    renderer = plan.renderer
    if (
        renderer is not None
        and trainer is not None
        and "tokenizer" not in renderer.options
        and _accepts(manager, "renderer", renderer.name, "tokenizer")
        and model_folder is not None
    ):
        updates["renderer"] = _ref(renderer, tokenizer=model_folder)
    trainer = updates.get("trainer", trainer)
    renderer = updates.get("renderer", renderer)
    if (
        trainer is not None
        and renderer is not None
        and "tokenizer" not in trainer.options
        and isinstance(renderer.options.get("tokenizer"), str)
        and _accepts(manager, "trainer", trainer.name, "tokenizer")
    ):
        updates["trainer"] = _ref(trainer, tokenizer=renderer.options["tokenizer"])
    if updates:
        plan = plan.model_copy(update=updates)
    resolved = resolve_plan(plan, manager=manager, path=str(plan_path))
    return replace(resolved, notes=(*resolved.notes, *notes)) if notes else resolved


def _shared_buffer(manager: PluginManager, plan: Any) -> ComponentRef | None:
    """With an ``[object_store]`` the async pipeline's sample buffer lives in it, under
    ``runs/<[run].name>/buffer``, where a sampler and a trainer meet: ``[sample_buffer]``
    defaults to ``object-store``, and its ``prefix`` is filled when its spec accepts one."""
    if plan.object_store is None or plan.run.pipeline != "async":
        return None
    ref = plan.sample_buffer or ComponentRef.model_validate({"name": SHARED_BUFFER})
    if "prefix" in ref.options or not _accepts(manager, "sample_buffer", ref.name, "prefix"):
        return ref if plan.sample_buffer is None else None
    return _ref(ref, prefix=f"runs/{plan.run.name}/buffer")


def _logger_paths(
    manager: PluginManager, refs: Sequence[ComponentRef], run_dir: Path
) -> list[ComponentRef]:
    """``refs`` with ``path`` filled (see the module docstring) where a logger requires one;
    an optional ``path`` keeps the logger's own default (an environment variable, say)."""
    names = [ref.name for ref in refs]
    out = []
    for index, ref in enumerate(refs):
        spec = _spec(manager, Kind.LOGGER, ref.name)
        accepted = spec is not None and "path" in spec.trait("run_keys")
        required = accepted and spec.config.model_fields["path"].is_required()
        if "path" in ref.options or not required:
            out.append(ref)
            continue
        file = ref.name if names.count(ref.name) == 1 else f"{ref.name}-{index}"
        out.append(_ref(ref, path=str(run_dir / LOGS_FOLDER / file)))
    return out


@dataclass
class Components:
    """The built components of a run. ``sandbox`` is None when the plan selects none;
    ``loss`` and ``advantage`` when it selects none and they were not required;
    ``sample_buffer`` when it selects none (the async pipeline then queues in memory; with an
    ``[object_store]`` the run selects ``object-store``); ``sampler`` (a
    :class:`~rllm_core.ports.PolicyFollower`, checked at build) when it selects none, and the
    rollouts then sample from ``trainer.sampler()``.
    ``loggers`` are the ``[[loggers]]`` entries, each with a label naming it
    (``"[loggers[0]] jsonl"``); they are in ``built`` too, so :meth:`aclose` closes them.
    ``placed`` maps each plan location (``"[trainer]"``) to its component."""

    trainer: ports.TrainerBackend
    renderer: ports.Renderer
    harness: ports.Harness
    tasks: ports.TaskSource
    trace_store: ports.TraceStore
    loss: ports.Loss | None = None
    advantage: ports.AdvantageEstimator | None = None
    sample_buffer: ports.SampleBuffer | None = None
    object_store: ports.ObjectStore | None = None
    sandbox: ports.SandboxBackend | None = None
    sampler: ports.Sampler | None = None
    aux_losses: list[tuple[ports.Loss, float]] = field(default_factory=list)
    loggers: list[tuple[str, ports.Logger]] = field(default_factory=list)
    built: list[Any] = field(default_factory=list)
    placed: dict[str, Any] = field(default_factory=dict)

    async def aclose(self) -> None:
        """Close every component that has ``close`` (sync or async), newest first."""
        for instance in reversed(self.built):
            close = getattr(instance, "close", None)
            if not callable(close):
                continue
            result = close()
            if inspect.isawaitable(result):
                await result


def build_components(
    resolved: ResolvedPlan, *, training: bool = True, on_built: Any = None
) -> Components:
    """Build every component of ``resolved``; a failing factory raises :class:`BuildError`
    after closing what was already built.

    ``training`` says which components are required: :data:`TRAINING_COMPONENTS`, or with
    ``False`` :data:`SAMPLING_COMPONENTS`. A required one the plan does not select raises
    :class:`BuildError` before anything is built. ``on_built`` is called with each resolved
    component once built.
    """
    required = TRAINING_COMPONENTS if training else SAMPLING_COMPONENTS
    missing = [where for where in required if resolved.get(where) is None]
    if missing:
        raise BuildError(
            f"{resolved.path}: the plan selects no {', '.join(missing)}; a"
            f" {'training run' if training else 'sampling run'} needs each of them"
        )
    built: dict[str, Any] = {}
    order: list[Any] = []
    try:
        # The object store first: a sample buffer may live in it.
        for component in sorted(resolved, key=lambda c: c.where != "[object_store]"):
            if component.kind is Kind.TRAINER_LAUNCHER:
                continue  # only the scheduler builds it (rllm_core.training.roles)
            try:
                instance = _build(component, built)
            except Exception as exc:
                raise BuildError(
                    f"{component.where}: building {component.kind.value}:{component.name}"
                    f" ({component.provider}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            built[component.where] = instance
            order.append(instance)
            if on_built is not None:
                on_built(component)
        _check_sampler(resolved, built)
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
    loggers = [(f"{c.where} {c.name}", built[c.where]) for c in resolved if c.kind is Kind.LOGGER]
    return Components(
        trainer=built["[trainer]"],
        renderer=built["[renderer]"],
        harness=built["[harness]"],
        tasks=built["[tasks]"],
        trace_store=built["[trace_store]"],
        loss=built.get("[algorithm].loss"),
        advantage=built.get("[algorithm].advantage"),
        sample_buffer=built.get("[sample_buffer]"),
        object_store=built.get("[object_store]"),
        sandbox=built.get("[sandbox]"),
        sampler=built.get("[sampler]"),
        aux_losses=aux,
        loggers=loggers,
        built=order,
        placed=built,
    )


def _build(component: Any, built: dict[str, Any]) -> Any:
    """Build ``component``, handing a sample buffer that accepts the run key ``store`` the
    built ``[object_store]``."""
    store = built.get("[object_store]")
    if component.where != "[sample_buffer]" or store is None:
        return component.build()
    if "store" in component.spec.trait("run_keys"):
        return component.spec.build(component.config.model_copy(update={"store": store}))
    return component.build()


def _check_sampler(resolved: ResolvedPlan, built: dict[str, Any]) -> None:
    """A ``[sampler]`` must follow the policy and the trainer must export it
    (:func:`~rllm_core.rollout.policy_sync.check_policy_follower`); :class:`BuildError`
    otherwise."""
    from rllm_core.rollout.policy_sync import SamplerMismatch, check_policy_follower

    sampler, trainer = resolved.get("[sampler]"), resolved.get("[trainer]")
    if sampler is None or trainer is None:
        return
    try:
        check_policy_follower(
            built["[sampler]"],
            built["[trainer]"],
            sampler_name=sampler.name,
            trainer_name=trainer.name,
        )
    except SamplerMismatch as exc:
        raise BuildError(f"{resolved.path}: {exc}") from None
