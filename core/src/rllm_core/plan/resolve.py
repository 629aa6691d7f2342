"""Resolving a validated plan against the installed plugins.

Every component reference becomes a :class:`ResolvedComponent`: the spec from the plugin
manager, the component's config validated against the spec's schema, and where in the file it
was written. All problems are collected and raised together as one :class:`PlanError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rllm_core.addresses import is_local_only
from rllm_core.errors import ComponentConflictError, PlanError, PlanIssue, UnknownComponentError
from rllm_core.plan.eval_check import eval_issues
from rllm_core.plan.load import issues_from_validation, load_plan
from rllm_core.plan.schema import (
    BUILTIN_LAUNCHERS,
    ComponentRef,
    Plan,
    component_sections,
    waiting_groups_bound,
)
from rllm_core.plan.teacher import resolve_teacher
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.plugins.specs import ComponentSpec, Kind

__all__ = [
    "SHARED_BUFFER",
    "ResolvedComponent",
    "ResolvedPlan",
    "resolve_plan",
    "resolve_plan_file",
]

SHARED_BUFFER = "object-store"
"""The sample buffer of a run with an ``[object_store]``, unless ``[sample_buffer]`` names it."""

AUX_COEF_KEY = "coef"
_ROLE = {"policy": "a policy", "auxiliary": "an auxiliary"}


@dataclass(frozen=True)
class ResolvedComponent:
    """One component of a plan, ready to build.

    ``where`` is how the user finds it in the file (``[algorithm].loss``); ``coef`` is set for
    auxiliary losses.
    """

    where: str
    spec: ComponentSpec
    config: BaseModel
    provider: str
    coef: float | None = None

    @property
    def kind(self) -> Kind:
        return self.spec.kind

    @property
    def name(self) -> str:
        return self.spec.name

    def build(self) -> Any:
        return self.spec.build(self.config)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "where": self.where,
            "kind": self.kind.value,
            "name": self.name,
            "provider": self.provider,
            "config": self.config.model_dump(mode="json"),
        }
        if self.coef is not None:
            data["coef"] = self.coef
        return data


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan whose every component resolved to an installed plugin with a valid config.

    ``notes`` are warnings about the plan that do not stop it (a key the run overrides, a
    warning a component's config raised while validating, such as a deprecated key), each
    naming the file, the key and what to do.
    """

    path: str
    plan: Plan
    components: Mapping[str, ResolvedComponent] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def get(self, where: str) -> ResolvedComponent | None:
        return self.components.get(where)

    def of_kind(self, kind: Kind) -> list[ResolvedComponent]:
        return [c for c in self.components.values() if c.kind is kind]

    def __iter__(self) -> Iterator[ResolvedComponent]:
        return iter(self.components.values())

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan.model_dump(mode="json", exclude_none=True)
        return {
            "path": self.path,
            "plan": plan,
            "components": [c.to_dict() for c in self.components.values()],
        }


def _component_issue(
    exc: UnknownComponentError | ComponentConflictError,
    *,
    path: str,
    section: str,
    key: str,
    value: str,
) -> PlanIssue:
    return PlanIssue(path=path, section=section, key=key, value=value, message=str(exc))


class _Resolver:
    def __init__(self, plan: Plan, manager: PluginManager, path: str) -> None:
        self.plan = plan
        self.manager = manager
        self.path = path
        self.issues: list[PlanIssue] = []
        self.notes: list[str] = []
        self.components: dict[str, ResolvedComponent] = {}

    def run(self) -> None:
        algorithm = self.plan.algorithm
        if algorithm.loss is not None:
            self.resolve(algorithm.loss, Kind.LOSS, section="algorithm", key="loss", role="policy")
        if algorithm.advantage is not None:
            self.resolve(
                algorithm.advantage, Kind.ADVANTAGE_ESTIMATOR, section="algorithm", key="advantage"
            )
            resolve_teacher(self)
        for index, ref in enumerate(algorithm.aux_losses):
            self.resolve(
                ref, Kind.LOSS, section="algorithm", key=f"aux_losses[{index}]", role="auxiliary"
            )
        for section, kind in component_sections(type(self.plan)).items():
            ref = getattr(self.plan, section)
            if ref is not None:
                self.resolve(ref, kind, section=section, key=None)
        for index, ref in enumerate(self.plan.loggers):
            self.resolve(ref, Kind.LOGGER, section=f"loggers[{index}]", key=None)
        self.resolve_launcher()
        self.refuse_idle_keys()

    def resolve_launcher(self) -> None:
        """``[scheduler].launcher`` other than a built-in one names a trainer launcher a plugin
        provides (resolved as ``[scheduler].launcher``); any launcher needs the
        ``[object_store]`` its jobs meet the scheduler in."""
        scheduler = self.plan.scheduler
        launcher = scheduler.launcher
        if isinstance(launcher, ComponentRef):
            before = len(self.issues)
            self.resolve(launcher, Kind.TRAINER_LAUNCHER, section="scheduler", key="launcher")
            for issue in self.issues[before:]:
                if issue.hint is None and issue.key in ("launcher", "launcher.name"):
                    builtin = " or ".join(f'"{name}"' for name in BUILTIN_LAUNCHERS)
                    issue.hint = (
                        f"name an installed launcher or a built-in one ({builtin}), or install"
                        " the plugin that provides it (`rllm-core plugins` lists the installed"
                        " trainer_launcher components)"
                    )
            resolved = self.components.get("[scheduler].launcher")
            if (
                scheduler.nodes
                and resolved is not None
                and not resolved.spec.trait("places_on_nodes")
            ):
                self.issue(
                    "scheduler",
                    "nodes",
                    scheduler.nodes[0].name,
                    f"convertible nodes lend a [sampler] server's machine to the trainer, but"
                    f" launcher {resolved.name!r} starts each trainer incarnation on machines of"
                    " its own choosing, not on the node (its spec is not 'places_on_nodes'):"
                    " every lent node would stop sampling for a trainer that runs elsewhere",
                    "remove [scheduler].nodes, or use a launcher that places jobs on nodes"
                    ' ("local-process" when the nodes are this machine)',
                )
        if scheduler.launches and self.plan.object_store is None:
            name = launcher.name if isinstance(launcher, ComponentRef) else launcher
            self.issue(
                "scheduler",
                "launcher",
                name,
                f"launcher {name!r} starts each trainer incarnation as a job of its own, which"
                " meets the scheduler only in the run's object store (its command file, ready"
                " marker, heartbeat and cuts); the plan has no [object_store]",
                'add an [object_store] section both can reach (name = "s3" for a job on another'
                ' machine, "file" on this one), or set launcher = "in-process"',
            )

    def refuse_idle_keys(self) -> None:
        """Keys and sections a run would accept and not use are errors, each saying why."""
        plan = self.plan
        if plan.is_sft:
            self.refuse_sft_keys()
            return
        self.refuse_pipeline_keys()
        self.refuse_sampler()
        self.refuse_export()
        self.refuse_native_loss()
        self.refuse_unreachable_gateway()
        self.refuse_gateway_workers()
        self.refuse_shaping()
        self.refuse_regularizers()
        self.refuse_aggregation()
        self.issues.extend(eval_issues(plan, self.components, self.path))
        trainer = self.components.get("[trainer]")
        proximal = plan.algorithm.proximal
        modes = trainer.spec.trait("proximal_modes") if trainer else None
        if modes is not None and proximal not in modes:
            self.issues.append(
                PlanIssue(
                    path=self.path,
                    section="algorithm",
                    key="proximal",
                    value=proximal,
                    message=(
                        f"trainer backend {trainer.name!r} cannot honour proximal = {proximal!r}"
                        f" (it offers {', '.join(repr(m) for m in modes)})"
                    ),
                    hint='use proximal = "rollout" or a trainer that recomputes logprobs',
                )
            )

    def refuse_regularizers(self) -> None:
        """The KL to the reference model and the entropy bonus need a trainer that computes
        them (:mod:`rllm_core.plan.regularizer_check`)."""
        from rllm_core.plan.regularizer_check import regularizer_issues

        self.issues.extend(regularizer_issues(self.plan, self.components, self.path))

    def refuse_aggregation(self) -> None:
        """A loss that pins its aggregation mode against the plan's
        (:mod:`rllm_core.plan.aggregation_check`)."""
        from rllm_core.plan.aggregation_check import aggregation_issues, aggregation_notes

        self.issues.extend(aggregation_issues(self.plan, self.components, self.path))
        self.notes.extend(aggregation_notes(self.plan, self.components, self.path))

    def refuse_gateway_workers(self) -> None:
        """``[gateway].workers`` above 1 where the run's sampler cannot serve several gateway
        processes (:mod:`rllm_core.plan.gateway_check`)."""
        from rllm_core.plan.gateway_check import gateway_issues

        self.issues.extend(gateway_issues(self.plan, self.components, self.path))

    def refuse_shaping(self) -> None:
        """Overlong settings the reward shaping cannot honour
        (:mod:`rllm_core.plan.shaping_check`)."""
        from rllm_core.plan.shaping_check import shaping_issues

        self.issues.extend(shaping_issues(self.plan, self.path, self.components))

    def refuse_sft_keys(self) -> None:
        """An ``[sft]`` plan (``rllm-core sft``) trains on examples: the sections of RL runs
        would be accepted and not used, and its data must exist."""
        from rllm_core.plan.sft_check import sft_issues

        self.issues.extend(sft_issues(self.plan, self.components, self.path))

    def refuse_sampler(self) -> None:
        """A ``[sampler]`` is kept on the policy with weights the trainer exports, which a
        backend declares with the trait ``exports_weights``."""
        sampler = self.components.get("[sampler]")
        trainer = self.components.get("[trainer]")
        if sampler is None or trainer is None or trainer.spec.trait("exports_weights"):
            return
        self.issue(
            "sampler",
            "name",
            sampler.name,
            f"sampler {sampler.name!r} needs weights exported by the trainer; trainer backend"
            f" {trainer.name!r} cannot export them",
            "remove [sampler] to sample from the trainer backend itself, or use a trainer"
            " backend that exports weights (torch)",
        )

    def refuse_export(self) -> None:
        """``[run].export`` writes a model folder, which a backend declares it can with the
        trait ``exports_weights``."""
        trainer = self.components.get("[trainer]")
        export = self.plan.run.export
        if export is None or trainer is None or trainer.spec.trait("exports_weights"):
            return
        self.issue(
            "run",
            "export",
            export,
            f"trainer backend {trainer.name!r} cannot export its weights as a model folder",
            "remove [run].export, or use a trainer backend that exports weights (torch)",
        )

    def refuse_unreachable_gateway(self) -> None:
        """A harness that calls the gateway from inside its sandboxes (config key
        ``network``) on a backend whose sandboxes run elsewhere (trait ``remote``) needs a
        ``[gateway].host`` they can reach: not loopback, link-local or unspecified."""
        sandbox = self.components.get("[sandbox]")
        harness = self.components.get("[harness]")
        if sandbox is None or harness is None or not sandbox.spec.trait("remote"):
            return
        network = getattr(harness.config, "network", None)
        host = self.plan.gateway.host
        if network not in ("gateway", "full") or not is_local_only(host):
            return
        self.issue(
            "gateway",
            "host",
            host,
            f"harness {harness.name!r} calls the gateway from inside its sandboxes (network ="
            f" {network!r}), and sandbox backend {sandbox.name!r} runs them on another machine,"
            f" which cannot reach {host!r} on this one",
            "set [gateway] host to an address of this machine the sandboxes reach (and the"
            " gateway's port open to them only)",
        )

    def refuse_native_loss(self) -> None:
        """``[trainer].loss_path = "native"`` on a backend with server-side loss kernels (trait
        ``native_losses``) needs an objective one of them computes: the policy loss alone, no
        rollout correction, the sampler's logprobs as the ratio's denominator
        (:func:`~rllm_core.algorithms.native_losses.route`)."""
        from rllm_core.algorithms.native_losses import NativeLossError, route

        trainer = self.components.get("[trainer]")
        loss = self.components.get("[algorithm].loss")
        if (
            trainer is None
            or loss is None
            or getattr(trainer.config, "loss_path", None) != "native"
        ):
            return
        available = tuple(trainer.spec.trait("native_losses") or ())
        if not available:
            return
        algorithm = self.plan.algorithm
        corrections = []
        if algorithm.correction.tis_cap is not None:
            corrections.append("tis_cap")
        if algorithm.correction.mask_low is not None:
            corrections.append("mask_low/mask_high")
        try:
            route(
                service=trainer.name,
                available=available,
                requested="native",
                loss_name=loss.name,
                loss_config=loss.config,
                aux_losses=[
                    c.name
                    for c in self.components.values()
                    if c.where.startswith("[algorithm].aux_losses") and c.coef
                ],
                corrections=corrections,
                proximal=algorithm.proximal,
            )
        except NativeLossError as exc:
            native = self.native_losses(available)
            self.issue(
                "trainer",
                "loss_path",
                "native",
                str(exc),
                'set loss_path = "auto" or "custom", or use a loss with a server-side kernel: '
                + (", ".join(native) if native else f"none installed for {trainer.name!r}")
                + ', without aux_losses or [algorithm].correction, and proximal = "rollout"',
            )

    def native_losses(self, available: Sequence[str]) -> list[str]:
        """The installed policy losses whose default config runs as one of ``available``, as
        ``"name ('kernel')"``."""
        from rllm_core.algorithms.native_losses import native_form

        out = []
        for record in self.manager.components(Kind.LOSS):
            spec = record.spec
            if spec.trait("role") != "policy":
                continue
            try:
                form = native_form(spec.name, spec.validate_config({}))
            except Exception:
                continue
            if not isinstance(form, str) and form.kernel in available:
                out.append(f"{spec.name} ({form.kernel!r})")
        return sorted(out)

    def refuse_pipeline_keys(self) -> None:
        """The policy-age bound and the sample buffer belong to the async pipeline, which needs
        a trainer that publishes weights while its sampler runs."""
        plan = self.plan
        algorithm = plan.algorithm
        age = algorithm.max_policy_age
        if plan.run.pipeline == "sync":
            if age != 0:
                self.issue(
                    "algorithm",
                    "max_policy_age",
                    age,
                    'with [run].pipeline = "sync" every sample is trained on by the policy that'
                    " produced it; no pipeline reads a policy-age bound",
                    'set [run].pipeline = "async" or remove the key',
                )
            if plan.object_store is not None:
                self.issue(
                    "object_store",
                    None,
                    None,
                    "the object store holds the async pipeline's shared state (its sample"
                    " buffer, rollout batches, policy releases and checkpoint cuts); a sync run"
                    " keeps everything in its run folder",
                    'set [run].pipeline = "async" or remove the section',
                )
            if plan.sample_buffer is not None:
                self.issue(
                    "sample_buffer",
                    None,
                    None,
                    'with [run].pipeline = "sync" each step passes its samples from rollouts to'
                    " the trainer in memory; only the async pipeline queues them in a buffer",
                    'set [run].pipeline = "async" or remove the section',
                )
            return
        per_step = algorithm.mini_batches * algorithm.epochs
        if age < max(1, per_step):
            self.issue(
                "algorithm",
                "max_policy_age",
                age,
                f"the async pipeline needs max_policy_age >= {max(1, per_step)}: each step"
                f" publishes mini_batches * epochs = {per_step} weight version(s), so a lower"
                " bound would drop every sample taken before the step that trains it",
                f"set [algorithm].max_policy_age to {max(1, per_step)} or more",
            )
        if (
            plan.scheduler.model_fields_set
            and plan.object_store is None
            and not plan.scheduler.launches  # resolve_launcher says why
        ):
            key = sorted(plan.scheduler.model_fields_set)[0]
            self.issue(
                "scheduler",
                key,
                getattr(plan.scheduler, key),
                "the scheduler starts and stops a trainer run with --role trainer, which"
                " shares its state with the samplers through an [object_store]",
                "add an [object_store] section, or remove [scheduler]",
            )
        if plan.scheduler.nodes and plan.sampler is None:
            node = plan.scheduler.nodes[0]
            self.issue(
                "scheduler",
                "nodes",
                node.name,
                "convertible nodes are the machines of the [sampler]'s model servers, each lent"
                " to the trainer in turn, and the plan has no [sampler]: its rollouts sample"
                " from the trainer",
                "add a [sampler] over the nodes' servers (each node's url one of its urls), or"
                " remove [scheduler].nodes",
            )
        q_on = plan.scheduler.q_on_groups
        if q_on is not None and plan.scheduler.alpha is not None:
            self.issue(
                "scheduler",
                "alpha",
                plan.scheduler.alpha,
                "q_on_groups and alpha both set when the trainer starts",
                "keep one: q_on_groups in groups, or alpha as a fraction of what the age bound"
                " lets wait",
            )
        if q_on is not None and plan.object_store is not None and plan.run.pipeline == "async":
            algorithm = plan.algorithm
            least = algorithm.batch_size
            most = waiting_groups_bound(
                least, algorithm.max_policy_age, algorithm.mini_batches * algorithm.epochs
            )
            if not least <= q_on <= most:
                self.issue(
                    "scheduler",
                    "q_on_groups",
                    q_on,
                    f"the trainer starts once q_on_groups groups wait; less than one batch"
                    f" ([algorithm].batch_size = {least}) leaves it nothing to train, and more"
                    f" than the {most} groups the age bound lets wait means it would never start",
                    f"set [scheduler].q_on_groups between {least} and {most}, or raise"
                    " [algorithm].max_policy_age",
                )
        buffer = plan.sample_buffer
        if plan.object_store is not None and buffer is not None and buffer.name != SHARED_BUFFER:
            self.issue(
                "sample_buffer",
                "name",
                buffer.name,
                "with an [object_store] the sample buffer lives in it, so that a sampler and a"
                " trainer in other processes or on other machines share it",
                f'remove [sample_buffer] (it defaults to "{SHARED_BUFFER}"), or [object_store]'
                " to train in one process",
            )
        if plan.object_store is None and buffer is not None and buffer.name == SHARED_BUFFER:
            self.issue(
                "sample_buffer",
                "name",
                buffer.name,
                f"sample_buffer:{SHARED_BUFFER} keeps its samples in the plan's object store,"
                " and the plan has none",
                'add an [object_store] section (name = "file" or "s3"), or choose another'
                " sample buffer",
            )
        trainer = self.components.get("[trainer]")
        if trainer is not None and not trainer.spec.trait("publishes_weights"):
            self.issue(
                "trainer",
                "name",
                trainer.name,
                f"trainer backend {trainer.name!r} cannot publish weights to its sampler while"
                ' it trains, which [run].pipeline = "async" needs',
                'use [run].pipeline = "sync" or a trainer backend that publishes weights',
            )

    def issue(self, section: str, key: str | None, value: Any, message: str, hint: str) -> None:
        self.issues.append(
            PlanIssue(
                path=self.path, section=section, key=key, value=value, message=message, hint=hint
            )
        )

    def resolve(
        self,
        ref: ComponentRef,
        kind: Kind,
        *,
        section: str,
        key: str | None,
        role: str | None = None,
    ) -> None:
        name_key = (
            key
            if key is not None and not ref.options
            else (f"{key}.name" if key is not None else "name")
        )
        where = f"[{section}].{key}" if key is not None else f"[{section}]"
        try:
            record = self.manager.get_record(kind, ref.name)
        except (UnknownComponentError, ComponentConflictError) as exc:
            self.issues.append(
                _component_issue(exc, path=self.path, section=section, key=name_key, value=ref.name)
            )
            return
        spec = record.spec
        if role is not None and spec.kind is Kind.LOSS and spec.trait("role") != role:
            wanted = "aux_losses" if spec.trait("role") == "auxiliary" else "loss"
            self.issues.append(
                PlanIssue(
                    path=self.path,
                    section=section,
                    key=name_key,
                    value=ref.name,
                    message=(
                        f"loss {spec.name!r} is {_ROLE[spec.trait('role')]} loss,"
                        f" not {_ROLE[role]} one"
                    ),
                    hint=f"select it with [algorithm].{wanted}",
                )
            )
            return
        options = ref.options
        if kind is Kind.TRAINER_BACKEND and "parallel" in options and not _parallel(spec):
            self.issue(
                section,
                "parallel",
                None,
                f"trainer backend {spec.name!r} trains in one process: it has no parallel"
                " table (it is no ParallelTrainer), so it cannot run in several processes",
                "remove [trainer].parallel, or select a trainer backend that trains in several"
                ' processes (name = "torch")',
            )
            options = {key: value for key, value in options.items() if key != "parallel"}
        coef: float | None = None
        if role == "auxiliary":
            takes_coef = AUX_COEF_KEY in spec.config.model_fields
            raw = options.get(AUX_COEF_KEY)
            if raw is None and not takes_coef:
                self.issues.append(
                    PlanIssue(
                        path=self.path,
                        section=section,
                        key=f"{key}.{AUX_COEF_KEY}",
                        message=f"auxiliary loss {spec.name!r} needs a coefficient",
                        hint=f'write {{ name = "{spec.name}", coef = 0.05 }}',
                    )
                )
                return
            if not takes_coef:
                options.pop(AUX_COEF_KEY)
                if not isinstance(raw, (int, float)) or isinstance(raw, bool):
                    self.issues.append(
                        PlanIssue(
                            path=self.path,
                            section=section,
                            key=f"{key}.{AUX_COEF_KEY}",
                            value=raw,
                            message=f"coef must be a number (got {raw!r})",
                        )
                    )
                    return
                coef = float(raw)
        owner = f"{kind.label} {spec.name!r}"
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                config = spec.validate_config(options)
        except ValidationError as exc:
            prefix = [key] if key is not None else []
            self.issues.extend(
                issues_from_validation(
                    exc,
                    path=self.path,
                    model=spec.config,
                    section=section,
                    prefix=prefix,
                    owner=owner,
                )
            )
            return
        self.notes.extend(f"{self.path}: {where}: {warning.message}" for warning in caught)
        if role == "auxiliary" and coef is None:
            coef = float(getattr(config, AUX_COEF_KEY))
        self.components[where] = ResolvedComponent(
            where=where, spec=spec, config=config, provider=record.plugin.label, coef=coef
        )


def _parallel(spec: ComponentSpec) -> bool:
    """Whether a trainer backend trains in several processes: its config's ``parallel`` key
    is the port's :class:`~rllm_core.ports.ParallelSettings` table."""
    from rllm_core.ports import ParallelSettings

    field = spec.config.model_fields.get("parallel") if spec.config is not None else None
    return field is not None and field.annotation is ParallelSettings


def resolve_plan(
    plan: Plan, *, manager: PluginManager | None = None, path: str = "<plan>"
) -> ResolvedPlan:
    """Resolve every component of ``plan``; raises :class:`PlanError` listing every problem."""
    resolver = _Resolver(plan, manager or get_plugin_manager(), path)
    resolver.run()
    if resolver.issues:
        raise PlanError(resolver.issues)
    return ResolvedPlan(
        path=path, plan=plan, components=resolver.components, notes=tuple(resolver.notes)
    )


def resolve_plan_file(
    path: str | Path, overrides: Sequence[str] = (), *, manager: PluginManager | None = None
) -> ResolvedPlan:
    """Load, override, validate and resolve a plan file in one call."""
    plan, _ = load_plan(path, overrides, manager=manager)
    return resolve_plan(plan, manager=manager, path=str(path))
