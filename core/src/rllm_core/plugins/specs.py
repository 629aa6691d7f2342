"""Frozen, typed specs that registry hooks yield: one class per component kind.

A spec says what a plan calls the component (``name``), how to build it (``factory``, called
with the validated config), which keys it accepts (``config``, a pydantic model) and what it
does in one line (``summary``). Building is lazy: an entry module can yield specs without
importing torch or an SDK, by pointing ``factory`` at :func:`lazy` ``("pkg.module:Class")``.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AdvantageEstimatorSpec",
    "ComponentSpec",
    "HarnessSpec",
    "Kind",
    "LazyFactory",
    "LoggerSpec",
    "LossSpec",
    "NoConfig",
    "PlanPath",
    "ObjectStoreSpec",
    "RendererSpec",
    "SampleBufferSpec",
    "SamplerSpec",
    "SandboxBackendSpec",
    "TaskSourceSpec",
    "TraceStoreSpec",
    "TrainerBackendSpec",
    "canonical_name",
    "lazy",
]


class Kind(enum.StrEnum):
    """Component kinds. The value is what ``rllm-core plugins`` shows before ``:name``."""

    LOSS = "loss"
    ADVANTAGE_ESTIMATOR = "advantage_estimator"
    RENDERER = "renderer"
    SANDBOX_BACKEND = "sandbox_backend"
    TRAINER_BACKEND = "trainer_backend"
    HARNESS = "harness"
    TASK_SOURCE = "task_source"
    TRACE_STORE = "trace_store"
    SAMPLE_BUFFER = "sample_buffer"
    OBJECT_STORE = "object_store"
    LOGGER = "logger"
    SAMPLER = "sampler"

    @property
    def hook_name(self) -> str:
        return _HOOK_NAMES[self]

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


_HOOK_NAMES = {
    Kind.LOSS: "rllm_losses",
    Kind.ADVANTAGE_ESTIMATOR: "rllm_advantage_estimators",
    Kind.RENDERER: "rllm_renderers",
    Kind.SANDBOX_BACKEND: "rllm_sandbox_backends",
    Kind.TRAINER_BACKEND: "rllm_trainer_backends",
    Kind.HARNESS: "rllm_harnesses",
    Kind.TASK_SOURCE: "rllm_task_sources",
    Kind.TRACE_STORE: "rllm_trace_stores",
    Kind.SAMPLE_BUFFER: "rllm_sample_buffers",
    Kind.OBJECT_STORE: "rllm_object_stores",
    Kind.LOGGER: "rllm_loggers",
    Kind.SAMPLER: "rllm_samplers",
}

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


def canonical_name(name: str) -> str:
    """Names compare case-insensitively with ``_`` and ``-`` equivalent: ``DPPO_TV`` is
    ``dppo-tv``."""
    return name.strip().lower().replace("_", "-")


class NoConfig(BaseModel):
    """The config of a component that takes no options."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class PlanPath:
    """Marks a config key whose value is a path on this machine, so that a relative value
    written in a plan is taken relative to the plan file's folder.

    Keys typed :class:`pathlib.Path` need no mark; a ``str`` key does
    (``tokenizer: Annotated[str, PlanPath()]``). ``or_name=True`` is for a key that takes a
    name or a folder (a model catalog name, a Hub id or a local model folder): its value is taken
    as a path only when it starts with ``./`` or ``../``, or has a ``/`` and names something
    that exists in the plan's folder; a bare word stays a name (write ``./name`` for a folder of
    that name). Paths inside a sandbox are not paths on this machine: do not mark them.
    """

    or_name: bool = False


@dataclass(frozen=True, slots=True)
class LazyFactory:
    """A factory named by import path; the module is imported only when the component is built.

    ``lazy("my_pkg.losses:MyLoss")`` calls ``MyLoss(config)`` on build.
    """

    target: str

    def __post_init__(self) -> None:
        module, sep, attr = self.target.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"lazy factory target {self.target!r} must look like 'module:attr'")

    def resolve(self) -> Callable[..., Any]:
        module_name, _, attr_path = self.target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
        return obj

    def __call__(self, config: BaseModel) -> Any:
        return self.resolve()(config)


def lazy(target: str) -> LazyFactory:
    """Name a factory by ``"module:attr"`` so that yielding the spec imports nothing heavy."""
    return LazyFactory(target)


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentSpec:
    """Base of every spec. Subclasses fix ``kind`` and may add kind-specific fields."""

    kind: ClassVar[Kind]

    name: str
    factory: Callable[[Any], Any]
    summary: str
    config: type[BaseModel] = NoConfig

    def __post_init__(self) -> None:
        if type(self) is ComponentSpec:
            raise TypeError("yield a kind-specific spec such as LossSpec, not ComponentSpec")
        canonical = canonical_name(self.name) if isinstance(self.name, str) else ""
        if not _NAME_RE.match(canonical):
            raise ValueError(
                f"{self.kind.value} name {self.name!r} is invalid: use lowercase letters, digits,"
                " '-' and '.', starting with a letter or digit"
            )
        object.__setattr__(self, "name", canonical)
        if not callable(self.factory):
            raise TypeError(f"{self.kind.value}:{self.name}: factory must be callable")
        if not (isinstance(self.config, type) and issubclass(self.config, BaseModel)):
            raise TypeError(
                f"{self.kind.value}:{self.name}: config must be a pydantic BaseModel subclass"
            )
        if not isinstance(self.summary, str) or not self.summary.strip() or "\n" in self.summary:
            raise ValueError(f"{self.kind.value}:{self.name}: summary must be one non-empty line")

    @property
    def key(self) -> str:
        return f"{self.kind.value}:{self.name}"

    @property
    def factory_path(self) -> str:
        """Where the factory lives, for ``rllm-core plugins -v``."""
        if isinstance(self.factory, LazyFactory):
            return self.factory.target
        module = getattr(self.factory, "__module__", "?")
        qualname = getattr(self.factory, "__qualname__", type(self.factory).__qualname__)
        return f"{module}:{qualname}"

    def validate_config(self, values: Mapping[str, Any] | BaseModel | None = None) -> BaseModel:
        """Validate plan keys against the config schema (raises ``pydantic.ValidationError``)."""
        if isinstance(values, self.config):
            return values
        return self.config.model_validate(dict(values or {}))

    def build(self, values: Mapping[str, Any] | BaseModel | None = None) -> Any:
        """Validate ``values`` and call the factory with the resulting config."""
        return self.factory(self.validate_config(values))


@dataclass(frozen=True, kw_only=True, slots=True)
class LossSpec(ComponentSpec):
    """A loss. ``role="policy"`` losses are selected by ``[algorithm].loss``; auxiliary losses
    stack on top through ``[algorithm].aux_losses``, each with its own coefficient."""

    kind: ClassVar[Kind] = Kind.LOSS
    role: Literal["policy", "auxiliary"] = "policy"


@dataclass(frozen=True, kw_only=True, slots=True)
class AdvantageEstimatorSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.ADVANTAGE_ESTIMATOR


@dataclass(frozen=True, kw_only=True, slots=True)
class RendererSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.RENDERER


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxBackendSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.SANDBOX_BACKEND


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerBackendSpec(ComponentSpec):
    """``proximal_modes``: the ``[algorithm].proximal`` choices the backend honours
    (``"rollout"`` always; ``"recompute"`` when it implements ``compute_logprobs``). ``plan
    check`` refuses any other choice, naming the backend."""

    kind: ClassVar[Kind] = Kind.TRAINER_BACKEND
    proximal_modes: tuple[str, ...] = ("rollout",)


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.HARNESS


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSourceSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.TASK_SOURCE


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceStoreSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.TRACE_STORE


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleBufferSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.SAMPLE_BUFFER


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectStoreSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.OBJECT_STORE


@dataclass(frozen=True, kw_only=True, slots=True)
class LoggerSpec(ComponentSpec):
    kind: ClassVar[Kind] = Kind.LOGGER


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplerSpec(ComponentSpec):
    """A sampler that lives outside the trainer (inference servers reached over the network).
    ``rllm-core gateway serve`` selects one; a training run samples from its trainer."""

    kind: ClassVar[Kind] = Kind.SAMPLER


SPEC_TYPES: Mapping[Kind, type[ComponentSpec]] = {
    spec.kind: spec
    for spec in (
        LossSpec,
        AdvantageEstimatorSpec,
        RendererSpec,
        SandboxBackendSpec,
        TrainerBackendSpec,
        HarnessSpec,
        TaskSourceSpec,
        TraceStoreSpec,
        SampleBufferSpec,
        ObjectStoreSpec,
        LoggerSpec,
        SamplerSpec,
    )
}
