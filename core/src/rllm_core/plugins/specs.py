"""The one frozen, typed spec every registry hook yields, and the component kinds.

A spec says which kind of component it is (``kind``), what a plan calls it (``name``), how to
build it (``factory``, called with the validated config), which keys it accepts (``config``, a
pydantic model), what it does in one line (``summary``) and, for kinds that have them, its
traits (a loss's ``role``, a trainer backend's ``proximal_modes``). Building is lazy: an entry
module can yield specs without importing torch or an SDK, by pointing ``factory`` at
:func:`lazy` ``("pkg.module:Class")``.

Kinds are declared where their registry hook is:
:func:`rllm_core.plugins.hookspecs.component_hookspec` registers a :class:`Kind` with its hook,
its port and its traits, so adding a kind takes that hookspec, the port and, when plans select
it, its plan section.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ComponentSpec",
    "Credential",
    "Kind",
    "LazyFactory",
    "NoConfig",
    "PATH_SHAPES",
    "PlanPath",
    "Trait",
    "canonical_name",
    "lazy",
]


@dataclass(frozen=True, slots=True)
class Trait:
    """A kind-specific property of a spec: its ``default`` and, when only some values make
    sense, the ``choices`` (for a tuple-valued trait, the values its items may take)."""

    default: Any
    choices: tuple[Any, ...] = ()

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not allowed, or None."""
        if not self.choices:
            return None
        items = value if isinstance(self.default, tuple) else (value,)
        if isinstance(self.default, tuple) and not isinstance(value, tuple):
            return f"must be a tuple of {self.choices}"
        bad = [item for item in items if item not in self.choices]
        return f"{bad[0]!r} is not one of {self.choices}" if bad else None


class _KindType(type):
    def __iter__(cls) -> Iterator[Kind]:
        return iter(list(cls._registry.values()))

    def __len__(cls) -> int:
        return len(cls._registry)

    def __getattr__(cls, attribute: str) -> Kind:
        found = cls._registry.get(attribute.lower())
        if found is None:
            raise AttributeError(
                f"no component kind {attribute.lower()!r} is declared; known:"
                f" {', '.join(cls._registry)}"
            )
        return found


class Kind(str, metaclass=_KindType):
    """A component kind: what ``rllm-core plugins`` prints before ``:name``.

    Kinds are declared by their registry hookspec
    (:func:`~rllm_core.plugins.hookspecs.component_hookspec`); ``Kind("loss")`` and
    ``Kind.LOSS`` give the same declared kind, iterating over ``Kind`` gives every declared
    kind in declaration order.
    """

    _registry: ClassVar[dict[str, Kind]] = {}
    hook_name: str
    port: type | None
    traits: Mapping[str, Trait]

    def __new__(cls, value: str | Kind) -> Kind:
        found = cls._registry.get(str(value))
        if found is None:
            raise ValueError(
                f"{value!r} is not a component kind; known: {', '.join(cls._registry)}"
            )
        return found

    @classmethod
    def declare(
        cls,
        value: str,
        *,
        hook_name: str,
        port: type | None = None,
        traits: Mapping[str, Trait] | None = None,
    ) -> Kind:
        """Register a kind (done by ``component_hookspec``); declaring it again with the same
        hook returns it, with another hook raises ``ValueError``."""
        existing = cls._registry.get(value)
        if existing is not None:
            if existing.hook_name != hook_name:
                raise ValueError(
                    f"kind {value!r} is already declared by {existing.hook_name}(), not"
                    f" {hook_name}()"
                )
            return existing
        if not re.fullmatch(r"[a-z][a-z0-9_]*", value):
            raise ValueError(f"kind {value!r} must be lowercase letters, digits and '_'")
        kind = str.__new__(cls, value)
        kind.hook_name = hook_name
        kind.port = port
        kind.traits = MappingProxyType(dict(traits or {}))
        cls._registry[value] = kind
        return kind

    @classmethod
    def forget(cls, value: str) -> None:
        """Remove a declared kind (for tests that declare one of their own)."""
        cls._registry.pop(value, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Kind, (str(self),))

    def __repr__(self) -> str:
        return f"Kind({str(self)!r})"

    @property
    def value(self) -> str:
        return str(self)

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


def canonical_name(name: str) -> str:
    """Names compare case-insensitively with ``_`` and ``-`` equivalent: ``DPPO_TV`` is
    ``dppo-tv``."""
    return name.strip().lower().replace("_", "-")


class NoConfig(BaseModel):
    """The config of a component that takes no options."""

    model_config = ConfigDict(extra="forbid", frozen=True)


PATH_SHAPES = ("file", "dir", "file-or-dir", "model", "tokenizer")
"""What :attr:`PlanPath.expects` may name."""


@dataclass(frozen=True, slots=True)
class PlanPath:
    """Marks a config key whose value is a path on this machine, so that a relative value
    written in a plan is taken relative to the plan file's folder.

    Keys typed :class:`pathlib.Path` need no mark; a ``str`` key does
    (``tokenizer: Annotated[str, PlanPath()]``). ``or_name=True`` is for a key that takes a
    name or a folder (a model catalog name, a Hub id or a local model folder): its value is taken
    as a path only when it starts with ``./`` or ``../``, or has a ``/`` and names something
    that exists in the plan's folder; a bare word stays a name (write ``./name`` for a folder of
    that name). Paths inside a sandbox are not paths on this machine: do not mark them. A mark
    on a list or a map of paths (``Annotated[dict[str, Path], PlanPath()]``) marks each item.

    ``expects`` says what must be there before a run, which ``rllm-core plan check`` checks:
    ``"file"``, ``"dir"``, ``"file-or-dir"``, ``"model"`` (resolved as
    :func:`~rllm_core.models.resolve_model` does: a catalog name, a folder with
    ``config.json`` and weights, or a Hub id in the Hugging Face cache) or ``"tokenizer"`` (as
    :func:`~rllm_core.models.resolve_tokenizer` does: a folder with ``tokenizer.json`` or
    ``tokenizer_config.json``). ``each_holds`` (with ``"dir"``) names a file the folder holds,
    or else each of its folders does (those starting with ``.`` or ``_`` skipped): a folder of
    task folders, say (``each_holds="task.toml"``). Unset: nothing need exist (a folder a
    component creates).
    """

    or_name: bool = False
    expects: str | None = None
    each_holds: str | None = None

    def __post_init__(self) -> None:
        if self.expects is not None and self.expects not in PATH_SHAPES:
            raise ValueError(f"PlanPath expects {self.expects!r}: use one of {PATH_SHAPES}")
        if self.each_holds is not None and self.expects != "dir":
            raise ValueError("PlanPath each_holds needs expects='dir'")


@dataclass(frozen=True, slots=True)
class Credential:
    """A secret a component needs to reach a remote service, declared on its
    :class:`ComponentSpec` (``credentials``) so that ``rllm-core plan check`` names the
    environment variable to set before a run fails on it.

    ``env`` are the variables that together carry it (each set and non-empty), named in the
    message; ``env_key`` is the config key whose value names the variable instead of
    ``env[0]`` (a plan may rename it); ``key`` is the config key that can carry the secret
    itself; ``also_env`` are other sets of variables, and ``files`` files (``~`` expanded),
    that carry it instead (``login``: the command that writes such a file); ``when`` holds the
    config values under which it is needed at all (``{"mode": "online"}``). ``what`` names it
    in the message ("Tinker API key").
    """

    what: str
    env: tuple[str, ...]
    key: str | None = None
    env_key: str | None = None
    also_env: tuple[tuple[str, ...], ...] = ()
    files: tuple[str, ...] = ()
    login: str | None = None
    when: Mapping[str, Any] = field(default_factory=dict)

    def config_keys(self) -> tuple[str, ...]:
        """The config keys this declaration reads."""
        keys = (self.key, self.env_key, *self.when)
        return tuple(key for key in keys if key is not None)

    def variables(self, config: BaseModel) -> tuple[str, ...]:
        """The variables that carry it under ``config`` (``env_key``'s value replaces
        ``env[0]``)."""
        if self.env_key is None:
            return self.env
        return (str(getattr(config, self.env_key)), *self.env[1:])

    def missing(self, config: BaseModel, environ: Mapping[str, str]) -> bool:
        """Whether ``config`` needs it and neither the config, ``environ`` nor a file has it."""
        if any(getattr(config, key, None) != value for key, value in self.when.items()):
            return False
        if self.key is not None and getattr(config, self.key, None):
            return False
        for names in (self.variables(config), *self.also_env):
            if all(environ.get(name) for name in names):
                return False
        return not any(os.path.exists(os.path.expanduser(file)) for file in self.files)


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
    """What a registry hook yields for one component (see the module docstring).

    ``kind`` may be given as its name (``kind="loss"``); ``traits`` holds the kind's traits
    that differ from their defaults (``traits={"role": "auxiliary"}`` for an auxiliary loss);
    :meth:`trait` reads one with its default. ``credentials`` are the secrets it needs to
    reach a remote service (:class:`Credential`).
    """

    kind: Kind
    name: str
    factory: Callable[[Any], Any]
    summary: str
    config: type[BaseModel] = NoConfig
    traits: Mapping[str, Any] = field(default_factory=dict)
    credentials: tuple[Credential, ...] = ()

    def __post_init__(self) -> None:
        try:
            kind = Kind(self.kind)
        except ValueError as exc:
            raise ValueError(f"spec {self.name!r}: {exc}") from None
        object.__setattr__(self, "kind", kind)
        canonical = canonical_name(self.name) if isinstance(self.name, str) else ""
        if not _NAME_RE.match(canonical):
            raise ValueError(
                f"{kind.value} name {self.name!r} is invalid: use lowercase letters, digits,"
                " '-' and '.', starting with a letter or digit"
            )
        object.__setattr__(self, "name", canonical)
        if not callable(self.factory):
            raise TypeError(f"{kind.value}:{self.name}: factory must be callable")
        if not (isinstance(self.config, type) and issubclass(self.config, BaseModel)):
            raise TypeError(
                f"{kind.value}:{self.name}: config must be a pydantic BaseModel subclass"
            )
        if not isinstance(self.summary, str) or not self.summary.strip() or "\n" in self.summary:
            raise ValueError(f"{kind.value}:{self.name}: summary must be one non-empty line")
        for trait, value in self.traits.items():
            declared = kind.traits.get(trait)
            if declared is None:
                known = ", ".join(kind.traits) or "none"
                raise ValueError(
                    f"{kind.value}:{self.name}: {kind.value} has no trait {trait!r} (its traits:"
                    f" {known})"
                )
            problem = declared.check(value)
            if problem:
                raise ValueError(f"{kind.value}:{self.name}: trait {trait!r}: {problem}")
        missing = [k for k in self.traits.get("run_keys", ()) if k not in self.config.model_fields]
        if missing:
            raise ValueError(
                f"{kind.value}:{self.name}: trait 'run_keys' lists {missing}, which its config"
                f" {self.config.__name__} has no field for; the run writes only keys the"
                " config declares"
            )
        object.__setattr__(self, "traits", MappingProxyType(dict(self.traits)))
        object.__setattr__(self, "credentials", tuple(self.credentials))
        for credential in self.credentials:
            if not isinstance(credential, Credential):
                raise TypeError(f"{kind.value}:{self.name}: credentials must be Credential objects")
            unknown = [k for k in credential.config_keys() if k not in self.config.model_fields]
            if unknown:
                raise ValueError(
                    f"{kind.value}:{self.name}: credential {credential!r} names keys its config"
                    f" lacks: {unknown}"
                )

    def trait(self, name: str) -> Any:
        """The spec's value of the kind's trait ``name``, or its default."""
        if name in self.traits:
            return self.traits[name]
        return self.kind.traits[name].default

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
