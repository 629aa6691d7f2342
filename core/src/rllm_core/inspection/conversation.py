"""One episode's conversation, rebuilt from the run's trace store (``rllm-core traces show``).

The trace store and the renderer are built from ``plan.resolved.json`` through the plugin
manager, as the run built them; core never imports the plugin. The trace store is opened to
read only when its plugin offers that (see :func:`open_trace_store`), so a run still writing it
is not disturbed. Token counts come from the
stored token ids; text comes from the messages the gateway stored with each trace
(``messages_delta``: the request's new messages, then the reply) or, for traces stored without
messages and on request, from decoding the stored ids with the renderer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from rllm_core.errors import ComponentError, StorageError
from rllm_core.inspection.errors import InspectionError
from rllm_core.inspection.runs import component_of
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.plugins.specs import ComponentSpec, Kind, LazyFactory
from rllm_core.run.folder import RunFolder
from rllm_core.types import Trace

__all__ = [
    "TraceRef",
    "history_break",
    "open_renderer",
    "open_trace_store",
    "read_only_opener",
    "read_traces",
    "trace_store_path",
    "turn_view",
]

TraceRef = tuple[str, str, Trace | None]
"""``(lineage_id, trace_id, trace)``; ``trace`` is None when the store lacks it."""


def trace_store_path(folder: RunFolder, configured: str) -> Path:
    """Where the trace store configured at ``configured`` is now.

    A run fills ``[trace_store].path`` with ``<run folder>/traces`` as the folder was spelled
    when it started (often relative to the directory it started in). So a path whose parent
    has the run folder's name is taken inside ``folder``; a path that exists is used as given;
    otherwise, when ``folder`` holds a folder of the path's last name (the run folder was
    renamed or copied), that one. The folder then reads from any directory, moved or copied.
    """
    path = Path(configured)
    inside = folder.path / path.name
    if path.parent.name == folder.path.resolve().name or (not path.is_dir() and inside.is_dir()):
        return inside
    return path


def _component(folder: RunFolder, where: str) -> dict[str, Any]:
    component = component_of(folder.read_resolved(), where)
    if component is None or not isinstance(component.get("name"), str):
        raise InspectionError(
            f"{folder.resolved_plan} selects no {where}; its traces cannot be read (a run"
            f" always has one: the file is damaged, restore it from the run's plan)"
        )
    return component


def _spec(manager: PluginManager, kind: Kind, component: Mapping[str, Any], folder: RunFolder):
    try:
        return manager.get_record(kind, component["name"]).spec
    except ComponentError as exc:
        raise InspectionError(
            f"{component['where']} of {folder.resolved_plan} is {kind.value}:{component['name']},"
            f" which cannot be loaded here: {exc}"
        ) from exc


def read_only_opener(spec: ComponentSpec) -> Callable[[Any], Any] | None:
    """How to open a trace store only to read it, or ``None`` when its plugin offers no way.

    A store class offers it as a class method ``open_read_only(config)`` next to the
    ``from_config``-style factory its spec names: it must take no lock and never create, write
    or truncate a file, so that a run writing the store meanwhile is not disturbed (the
    ``deltachain`` store does).
    """
    factory: Any = spec.factory
    if isinstance(factory, LazyFactory):
        factory = factory.resolve()
    owner = getattr(factory, "__self__", factory)
    opener = getattr(owner, "open_read_only", None) if isinstance(owner, type) else None
    return opener if callable(opener) else None


def open_trace_store(folder: RunFolder, *, manager: PluginManager | None = None) -> Any:
    """Open the run's trace store from ``[trace_store]`` of ``plan.resolved.json``, its
    ``path`` placed by :func:`trace_store_path`, read-only when the store offers that
    (:func:`read_only_opener`): a run still writing it goes on undisturbed, and what it wrote
    before the store was opened is read. A store without a read-only mode is built as the run
    built it. Close it when done.

    Raises :class:`InspectionError` when the plan has no trace store, its folder is missing
    (checked before building: a store would create an empty one), its plugin is not installed,
    or it cannot be opened (a store without a read-only mode that admits one process at a time,
    while the run holds it).
    """
    component = _component(folder, "[trace_store]")
    config = dict(component.get("config") or {})
    where = "the trace store"
    if isinstance(config.get("path"), str):
        path = trace_store_path(folder, config["path"])
        if not path.is_dir():
            raise InspectionError(
                f"the trace store of {folder.path} is missing: {path} does not exist"
                f" ([trace_store].path in plan.resolved.json is {config['path']!r}, nor is"
                f" there {folder.path / path.name}); put the run's {path.name}/ folder back next"
                " to plan.resolved.json"
            )
        config["path"] = str(path)
        where = f"the trace store at {path}"
    spec = _spec(manager or get_plugin_manager(), Kind.TRACE_STORE, component, folder)
    opener = None
    try:
        opener = read_only_opener(spec)
        if opener is not None:
            return opener(spec.validate_config(config))
        return spec.build(config)
    except StorageError as exc:
        hint = (
            ""
            if opener is not None
            else f" (trace_store:{component['name']} has no read-only mode, and a run still"
            " going holds its store: wait for it to end; `--list` works meanwhile)"
        )
        raise InspectionError(f"cannot open {where} of {folder.path}: {exc}{hint}") from exc
    except Exception as exc:
        raise InspectionError(
            f"cannot open {where} of {folder.path} (trace_store:{component['name']}):"
            f" {type(exc).__name__}: {exc}"
        ) from exc


def open_renderer(folder: RunFolder, *, manager: PluginManager | None = None) -> Any:
    """Build the run's renderer from ``[renderer]`` of ``plan.resolved.json`` (its tokenizer
    is the one the run used). Raises :class:`InspectionError` when it cannot be built."""
    component = _component(folder, "[renderer]")
    spec = _spec(manager or get_plugin_manager(), Kind.RENDERER, component, folder)
    try:
        return spec.build(dict(component.get("config") or {}))
    except Exception as exc:
        raise InspectionError(
            f"cannot build the renderer of {folder.path} (renderer:{component['name']}, config"
            f" in [renderer] of plan.resolved.json): {type(exc).__name__}: {exc}"
        ) from exc


def read_traces(store: Any, record: Mapping[str, Any], *, folder: RunFolder) -> list[TraceRef]:
    """The traces of the episode ``record`` in trajectory order, then call order, each with
    its full prompt rebuilt by the store. Raises :class:`InspectionError` when the store holds
    nothing of the episode's session."""
    session_id = str(record.get("session_id"))
    traces = {t.record.trace_id: t for t in store.session(session_id)}
    if not traces:
        raise InspectionError(
            f"the trace store of {folder.path} holds no trace of session {session_id!r}"
            f" (episode {record.get('episode_id')!r}); a store that keeps traces in memory"
            " loses them when the run ends, and a deleted session is gone"
        )
    refs: list[TraceRef] = []
    for trajectory in record.get("trajectories", []):
        lineage = str(trajectory.get("lineage_id", ""))
        for trace_id in trajectory.get("trace_ids", []):
            refs.append((lineage, trace_id, traces.get(trace_id)))
    return refs


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def turn_view(ref: TraceRef, *, renderer: Any = None) -> dict[str, Any]:
    """One model call as a JSON-ready object.

    Keys: ``lineage_id``, ``trace_id``, ``missing`` (the store lacks the trace; nothing else
    then), ``turn``, ``parent_trace_id``, ``reset_reason``, ``chain_complete``,
    ``prompt_tokens`` (the full prompt), ``prompt_delta_tokens`` (what this call added),
    ``completion_tokens``, ``mean_logprob`` (over the completion; None when empty),
    ``finish_reason``, ``weight_version``, ``latency_s``, ``messages`` (the stored messages,
    each with ``role`` and ``content`` and any other field set) and, when ``renderer`` is
    given, ``text``: ``prompt_delta`` and ``completion`` decoded from the stored ids.
    """
    lineage, trace_id, trace = ref
    if trace is None:
        return {"lineage_id": lineage, "trace_id": trace_id, "missing": True}
    record = trace.record
    view: dict[str, Any] = {
        "lineage_id": lineage,
        "trace_id": trace_id,
        "missing": False,
        "turn": record.turn,
        "parent_trace_id": record.parent_trace_id,
        "reset_reason": record.reset_reason,
        "chain_complete": trace.chain_complete,
        "prompt_tokens": len(trace.prompt_token_ids),
        "prompt_delta_tokens": len(record.prompt_delta_token_ids),
        "completion_tokens": len(record.completion_token_ids),
        "mean_logprob": _mean(record.logprobs),
        "finish_reason": record.finish_reason,
        "weight_version": record.weight_version,
        "latency_s": record.latency_s,
        "messages": [msgspec.to_builtins(m) for m in record.messages_delta],
    }
    if renderer is not None:
        view["text"] = {
            "prompt_delta": renderer.decode(record.prompt_delta_token_ids),
            "completion": renderer.decode(record.completion_token_ids),
        }
    return view


def history_break(trace: Trace | None) -> dict[str, Any] | None:
    """What the gateway recorded of a history break on the call ``trace`` (see
    :mod:`rllm_core.gateway.history`: ``reason``, ``at``, ``kept``, ``dropped``, ``inserted``
    and ``source``), or ``None`` when it recorded none or the trace is missing."""
    from rllm_core.gateway.history import HistoryBreak

    if trace is None:
        return None
    found = HistoryBreak.from_record(trace.record.reset_reason, trace.record.flags)
    return None if found is None else msgspec.to_builtins(found)
