"""The plugin manager: safe discovery, conflict detection and typed lookups.

Entry points in the ``rllm_core`` group are loaded one at a time. A plugin that fails to import,
fails to register, misspells a hook or yields something that is not a valid spec becomes a
recorded error on its :class:`PluginRecord`; nothing else is affected. Set
``RLLM_CORE_STRICT_PLUGINS=1`` to raise instead, and ``RLLM_CORE_DISABLE_PLUGINS=dist-a,dist-b``
to skip distributions by name.

The rest of the code asks questions (``get("loss", "dppo-tv")``) and never touches ``pm.hook``.
"""

from __future__ import annotations

import difflib
import enum
import importlib.metadata as importlib_metadata
import logging
import os
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from rllm_core.errors import ComponentConflictError, PluginLoadError, UnknownComponentError
from rllm_core.plugins import hookspecs
from rllm_core.plugins.aliases import alias_hint, squash
from rllm_core.plugins.catalog import known_provider
from rllm_core.plugins.specs import ComponentSpec, Kind, canonical_name
from rllm_core.types import RunInfo, RunStatus

__all__ = [
    "ComponentRecord",
    "PluginManager",
    "PluginRecord",
    "PluginStatus",
    "get_plugin_manager",
    "reset_plugin_manager",
]

log = logging.getLogger(__name__)

STRICT_ENV = "RLLM_CORE_STRICT_PLUGINS"
DISABLE_ENV = "RLLM_CORE_DISABLE_PLUGINS"

HookErrorHandler = Callable[[str, str, Exception], None]
"""Told ``(plugin label, hook name, exception)`` when a lifecycle hook implementation raises."""


class PluginStatus(enum.StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"
    ERROR = "error"
    CONFLICT = "conflict"


@dataclass
class PluginRecord:
    """What the manager knows about one plugin (one entry point, or one in-process object)."""

    name: str
    distribution: str
    version: str
    module: str
    status: PluginStatus = PluginStatus.ACTIVE
    error: str | None = None
    traceback: str | None = None
    components: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"

    def to_dict(self, verbose: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status.value,
            "provides": list(self.components),
            "error": self.error,
            "conflicts": list(self.conflicts),
        }
        if verbose:
            data["module"] = self.module
            data["traceback"] = self.traceback
        return data


@dataclass(frozen=True)
class ComponentRecord:
    """A spec and the plugin that provided it."""

    spec: ComponentSpec
    plugin: PluginRecord

    @property
    def key(self) -> str:
        return self.spec.key


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _normalize_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _disabled_from_env() -> set[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return {_normalize_dist(part) for part in raw.split(",") if part.strip()}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class PluginManager:
    """Discovers plugins and answers questions about the components they provide.

    ``PluginManager()`` loads entry points lazily on first use. Tests build one with
    ``load_entry_points=False`` and :meth:`register` objects directly. ``hookspecs_modules``
    adds modules of hook specifications beyond the core's (a kind declared elsewhere with
    :func:`~rllm_core.plugins.hookspecs.component_hookspec`).
    """

    def __init__(
        self,
        *,
        load_entry_points: bool = True,
        group: str = hookspecs.PROJECT_NAME,
        strict: bool | None = None,
        disabled: Iterable[str] | None = None,
        hookspecs_modules: Iterable[ModuleType] = (),
    ) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        for module in hookspecs_modules:
            self._pm.add_hookspecs(module)
        self._group = group
        self._want_entry_points = load_entry_points
        self._entry_points_loaded = False
        self.strict = _env_flag(STRICT_ENV) if strict is None else strict
        self.disabled = (
            _disabled_from_env()
            if disabled is None
            else {_normalize_dist(name) for name in disabled}
        )
        self._plugins: dict[str, PluginRecord] = {}
        self._objects: dict[str, object] = {}
        self._registry: dict[tuple[Kind, str], list[ComponentRecord]] | None = None

    # ---------------------------------------------------------------- loading

    def load(self) -> None:
        """Load every entry point once. Called implicitly by every query."""
        if self._want_entry_points and not self._entry_points_loaded:
            self._entry_points_loaded = True
            for entry_point in sorted(
                importlib_metadata.entry_points(group=self._group),
                key=lambda ep: (_normalize_dist(ep.dist.name) if ep.dist else "", ep.name),
            ):
                self._load_entry_point(entry_point)

    def _load_entry_point(self, entry_point: importlib_metadata.EntryPoint) -> None:
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else entry_point.name
        version = dist.version if dist is not None else "unknown"
        plugin_name = entry_point.name
        if plugin_name in self._plugins:
            plugin_name = f"{plugin_name}@{dist_name}"
        record = PluginRecord(
            name=plugin_name, distribution=dist_name, version=version, module=entry_point.value
        )
        self._plugins[plugin_name] = record
        self._registry = None
        if _normalize_dist(dist_name) in self.disabled:
            record.status = PluginStatus.DISABLED
            return
        try:
            obj = entry_point.load()
        except (Exception, SystemExit) as exc:  # a broken plugin must never take the host down
            self._fail(record, f"failed to import {entry_point.value}: {_one_line(exc)}", exc)
            return
        self._register_object(record, obj)

    def register(
        self,
        plugin: object,
        *,
        name: str | None = None,
        distribution: str | None = None,
        version: str = "0+local",
    ) -> PluginRecord:
        """Register an in-process plugin object (a module, class or instance with hookimpls).

        Used by tests and by applications embedding rllm-core. The record's distribution
        defaults to ``name``.
        """
        plugin_name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if plugin_name in self._plugins:
            raise ValueError(f"a plugin named {plugin_name!r} is already registered")
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        record = PluginRecord(
            name=plugin_name,
            distribution=distribution or plugin_name,
            version=version,
            module=module,
        )
        self._plugins[plugin_name] = record
        self._registry = None
        if _normalize_dist(record.distribution) in self.disabled:
            record.status = PluginStatus.DISABLED
            return record
        self._register_object(record, plugin)
        self._collect()
        return record

    def unregister(self, name: str) -> None:
        """Forget a plugin registered under ``name`` (no-op when unknown)."""
        record = self._plugins.pop(name, None)
        obj = self._objects.pop(name, None)
        if obj is not None and self._pm.is_registered(obj):
            self._pm.unregister(obj)
        if record is not None:
            self._registry = None

    def _register_object(self, record: PluginRecord, obj: object) -> None:
        problems = self._misspelled_hooks(obj)
        if problems:
            self._fail(record, "; ".join(problems))
            return
        try:
            self._pm.register(obj, name=record.name)
        except Exception as exc:
            self._fail(record, f"failed to register: {_one_line(exc)}", exc)
            return
        self._objects[record.name] = obj

    def _misspelled_hooks(self, obj: object) -> list[str]:
        known = {name for name in self._pm.hook.__dict__ if name.startswith("rllm_")}
        problems = []
        for attr in dir(obj):
            if not attr.startswith("rllm_") or attr in known:
                if attr in known and not self._is_marked(getattr(obj, attr, None)):
                    problems.append(
                        f"{attr} is not marked with @hookimpl (from rllm_core import hookimpl),"
                        " so it would never be called"
                    )
                continue
            value = getattr(obj, attr, None)
            if not callable(value):
                continue
            close = difflib.get_close_matches(attr, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"{attr} is not an rllm-core hook{hint}")
        return problems

    @staticmethod
    def _is_marked(value: Any) -> bool:
        return value is not None and hasattr(value, f"{hookspecs.PROJECT_NAME}_impl")

    def _fail(self, record: PluginRecord, message: str, exc: BaseException | None = None) -> None:
        record.status = PluginStatus.ERROR
        record.error = message
        if exc is not None:
            record.traceback = "".join(traceback.format_exception(exc))
        obj = self._objects.pop(record.name, None)
        if obj is not None and self._pm.is_registered(obj):
            self._pm.unregister(obj)
        log.warning("plugin %s (%s) disabled: %s", record.name, record.label, message)
        if self.strict:
            raise PluginLoadError(f"plugin {record.name} ({record.label}): {message}") from exc

    # ---------------------------------------------------------------- collecting

    def _collect(self) -> dict[tuple[Kind, str], list[ComponentRecord]]:
        self.load()
        if self._registry is not None:
            return self._registry
        registry: dict[tuple[Kind, str], list[ComponentRecord]] = {}
        for record in self._plugins.values():
            record.components.clear()
            record.conflicts.clear()
        for record in list(self._plugins.values()):
            if record.status is not PluginStatus.ACTIVE:
                continue
            collected = self._collect_plugin(record)
            if collected is None:
                continue
            for spec in collected:
                record.components.append(spec.key)
                registry.setdefault((spec.kind, spec.name), []).append(
                    ComponentRecord(spec=spec, plugin=record)
                )
        for (kind, name), providers in registry.items():
            if len(providers) > 1:
                for provider in providers:
                    provider.plugin.status = PluginStatus.CONFLICT
                    others = [p.plugin.label for p in providers if p.plugin is not provider.plugin]
                    provider.plugin.conflicts.append(
                        f"{kind.value}:{name} also provided by " + ", ".join(others or ["itself"])
                    )
        self._registry = registry
        return registry

    def _collect_plugin(self, record: PluginRecord) -> list[ComponentSpec] | None:
        obj = self._objects.get(record.name)
        if obj is None:
            return []
        specs: list[ComponentSpec] = []
        for kind in Kind:
            impl = getattr(obj, kind.hook_name, None)
            if impl is None:
                continue
            try:
                result = impl()
                items = [] if result is None else list(result)
            except Exception as exc:
                self._fail(record, f"{kind.hook_name}() raised {_one_line(exc)}", exc)
                return None
            for item in items:
                if not isinstance(item, ComponentSpec) or item.kind is not kind:
                    what = (
                        f"a {item.kind.value} spec"
                        if isinstance(item, ComponentSpec)
                        else type(item).__name__
                    )
                    self._fail(
                        record,
                        f"{kind.hook_name}() yielded {what}, expected a ComponentSpec of kind"
                        f" {kind.value!r}",
                    )
                    return None
                specs.append(item)
        return specs

    # ---------------------------------------------------------------- questions

    def plugins(self) -> list[PluginRecord]:
        """Every plugin seen, in load order, with status and provided components."""
        self._collect()
        return list(self._plugins.values())

    def components(self, kind: Kind | str | None = None) -> list[ComponentRecord]:
        """Every usable component (conflicting ones excluded), sorted by kind and name."""
        wanted = Kind(kind) if kind is not None else None
        out = [
            providers[0]
            for (k, _), providers in self._collect().items()
            if len(providers) == 1 and (wanted is None or k is wanted)
        ]
        return sorted(out, key=lambda c: (c.spec.kind.value, c.spec.name))

    def names(self, kind: Kind | str) -> list[str]:
        return [c.spec.name for c in self.components(kind)]

    def get(self, kind: Kind | str, name: str) -> ComponentSpec:
        """The spec of ``kind:name``; raises :class:`UnknownComponentError` or
        :class:`ComponentConflictError` with everything a user needs to fix the plan."""
        return self.get_record(kind, name).spec

    def get_record(self, kind: Kind | str, name: str) -> ComponentRecord:
        kind = Kind(kind)
        key = canonical_name(name)
        providers = self._collect().get((kind, key), [])
        if len(providers) == 1:
            return providers[0]
        if providers:
            raise ComponentConflictError(
                kind=kind.value, name=key, providers=[p.plugin.label for p in providers]
            )
        raise self._unknown(kind, name)

    def _unknown(self, kind: Kind, name: str) -> UnknownComponentError:
        key = canonical_name(name)
        available = self.names(kind)
        alias = alias_hint(kind, name, available)
        close = [n for n in available if squash(n) == squash(name)]
        if alias is not None:
            close = [alias.suggestion] if alias.suggestion else []
        elif not close:
            close = difflib.get_close_matches(key, available, n=1, cutoff=0.6)
        hints = [alias.text] if alias is not None else []
        elsewhere = [
            k.value.replace("_", " ") for k, n in self._collect() if n == key and k != kind
        ]
        if elsewhere:
            if not hints and close:
                hints.append(f"did you mean {close[0]!r}?")
            what = kind.value.replace("_", " ")
            article = "an" if what[0] in "aeiou" else "a"
            hints.append(f"{key!r} is an installed {' and '.join(elsewhere)}, not {article} {what}")
        provider = known_provider(kind, key)
        failed = [r for r in self._plugins.values() if r.status is PluginStatus.ERROR]
        if provider:
            owner = [r for r in failed if _normalize_dist(r.distribution) == provider]
            if owner:
                r = owner[0]
                return UnknownComponentError(
                    kind=kind.value,
                    name=name,
                    available=available,
                    provider=provider,
                    failed_plugins=[(r.name, r.error or "")],
                    reason=(
                        f"{kind.value}:{key} is provided by {r.label}, which failed to load:"
                        f" {r.error}; run `rllm-core plugins -v` for the traceback"
                    ),
                )
            disabled = [
                r
                for r in self._plugins.values()
                if r.status is PluginStatus.DISABLED and _normalize_dist(r.distribution) == provider
            ]
            if disabled:
                return UnknownComponentError(
                    kind=kind.value,
                    name=name,
                    available=available,
                    provider=provider,
                    reason=(
                        f"{kind.value}:{key} is provided by {disabled[0].label}, which is disabled"
                        f" by {DISABLE_ENV}; remove it from that variable"
                    ),
                )
        return UnknownComponentError(
            kind=kind.value,
            name=name,
            available=available,
            suggestion=close[0] if close else None,
            provider=provider if provider and not close and alias is None else None,
            failed_plugins=[(r.name, r.error or "") for r in failed if not provider],
            hint="; ".join(hints) or None,
        )

    def has_errors(self) -> bool:
        return any(r.status in (PluginStatus.ERROR, PluginStatus.CONFLICT) for r in self.plugins())

    # ---------------------------------------------------------------- lifecycle

    def notify_run_start(self, run: RunInfo, *, on_error: HookErrorHandler | None = None) -> None:
        self._notify("rllm_run_start", on_error, run=run)

    def notify_step_start(
        self, run: RunInfo, step: int, *, on_error: HookErrorHandler | None = None
    ) -> None:
        self._notify("rllm_step_start", on_error, run=run, step=step)

    def notify_step_end(
        self,
        run: RunInfo,
        step: int,
        metrics: Mapping[str, float],
        *,
        on_error: HookErrorHandler | None = None,
    ) -> None:
        self._notify("rllm_step_end", on_error, run=run, step=step, metrics=metrics)

    def notify_run_end(
        self,
        run: RunInfo,
        status: RunStatus,
        error: BaseException | None = None,
        *,
        on_error: HookErrorHandler | None = None,
    ) -> None:
        self._notify("rllm_run_end", on_error, run=run, status=status, error=error)

    def _notify(self, hook_name: str, on_error: HookErrorHandler | None, **kwargs: Any) -> None:
        """Call one lifecycle hook on every active plugin, in registration order. A raising
        observer is skipped (strict mode re-raises): observers never stop a run. It is reported
        to ``on_error(plugin label, hook name, exception)``, or logged when none is given."""
        self._collect()
        caller = getattr(self._pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            call_kwargs = {name: kwargs[name] for name in impl.argnames}
            try:
                impl.function(**call_kwargs)
            except Exception as exc:
                record = self._plugins.get(impl.plugin_name)
                label = record.label if record else impl.plugin_name
                if on_error is not None:
                    on_error(label, hook_name, exc)
                else:
                    log.warning("plugin %s: %s raised %s", label, hook_name, _one_line(exc))
                if self.strict:
                    raise


_DEFAULT: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, built on first use from the installed entry points."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = PluginManager()
    return _DEFAULT


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests, or after installing a plugin in-process)."""
    global _DEFAULT
    _DEFAULT = None
