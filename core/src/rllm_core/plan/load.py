"""Reading ``plan.toml``: parsing, ``--set`` overrides, paths made absolute and schema
validation with located errors.

Relative paths in a plan are relative to the folder holding the plan file, whatever the working
directory: :func:`load_plan` rewrites every path-valued key to an absolute path before anything
validates it. A key is path-valued when the core declares it (``[run].output_dir``) or when a
component's config schema types it as :class:`pathlib.Path` or marks it with :class:`PlanPath`
(``tokenizer: Annotated[str, PlanPath()]``). Absolute paths, ``~/...`` and URLs (``s3://...``)
stay as written. A value given with ``--set`` is relative to the working directory instead: the
user typed it there, as for any other command-line path.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError

from rllm_core.errors import ComponentError, PlanError, PlanIssue
from rllm_core.plan.schema import COMPONENT_SECTIONS, Plan
from rllm_core.plugins.specs import Kind, PlanPath
from rllm_core.toml_text import MAX_TOML_NESTING, TomlNestingError, load_toml_text

if typing.TYPE_CHECKING:
    from rllm_core.plugins.manager import PluginManager

__all__ = [
    "PlanPath",
    "apply_overrides",
    "issues_from_validation",
    "load_plan",
    "parse_plan",
    "read_plan_file",
    "resolve_plan_paths",
]


CORE_PATH_KEYS: tuple[tuple[str, str], ...] = (("run", "output_dir"),)
"""Keys of the core schema that hold paths, as ``(section, key)``."""

_Key = tuple[str | int, ...]


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error is a :class:`PlanError`."""
    path = Path(path)
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(
            [
                PlanIssue(
                    path=label,
                    section="",
                    key=None,
                    message="plan file not found",
                    hint="check the path, or start from examples/quickstart/plan.toml",
                )
            ]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(
            [PlanIssue(path=label, section="", key=None, message=f"cannot read plan: {exc}")]
        ) from exc
    try:
        return load_toml_text(text)
    except TomlNestingError as exc:
        raise PlanError(
            [
                PlanIssue(
                    path=label,
                    section="",
                    key=None,
                    message=f"invalid plan: {exc}",
                    hint="no plan key needs more than a few levels; remove the nested value",
                )
            ]
        ) from None
    except ValueError as exc:
        raise PlanError(
            [
                PlanIssue(
                    path=label,
                    section="",
                    key=None,
                    message=f"invalid TOML: {exc}",
                    hint="fix the syntax at that line (strings need quotes, tables [brackets])",
                )
            ]
        ) from exc


def _parse_value(raw: str) -> Any:
    try:
        return load_toml_text(f"v = {raw}")["v"]
    except ValueError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *, path: str) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides; values parse as TOML, else as plain strings.

    A key that selects a component by a bare name (``algorithm.loss = "x"``) turns into a table
    when an override sets one of its keys (``algorithm.loss.delta=0.2``).
    """
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        parts = [p.strip() for p in dotted.split(".")] if sep else []
        if len(parts) > MAX_TOML_NESTING:
            raise PlanError(
                [
                    PlanIssue(
                        path=path,
                        section=parts[0],
                        key=None,
                        value=item,
                        message=f"--set {dotted[:80]!r}... names a key {len(parts)} levels deep;"
                        f" a plan nests at most {MAX_TOML_NESTING}",
                    )
                ]
            )
        if not sep or len(parts) < 2 or not all(parts):
            raise PlanError(
                [
                    PlanIssue(
                        path=path,
                        section="",
                        key=None,
                        value=item,
                        message=f"--set {item!r} is not of the form section.key=value",
                        hint="for example --set run.steps=20",
                    )
                ]
            )
        node: dict[str, Any] = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if isinstance(child, str):
                child = {"name": child}
                node[part] = child
            elif child is None:
                child = {}
                node[part] = child
            elif not isinstance(child, dict):
                raise PlanError(
                    [
                        PlanIssue(
                            path=path,
                            section=".".join(parts[: depth + 1]),
                            key=None,
                            value=item,
                            message=f"--set {item!r}: {'.'.join(parts[: depth + 1])} is a"
                            " value, not a table",
                        )
                    ]
                )
            node = child
        node[parts[-1]] = _parse_value(raw.strip())
    return data


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    """``key`` as a TOML file writes it: bare when it can be, else quoted (``""``, ``"a b"``)."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _split_location(loc: Sequence[int | str]) -> tuple[str, str | None]:
    """Turn a pydantic error location into (section, key) as a user reads the file."""
    parts = [p if isinstance(p, str) and p.isdigit() else _toml_key(str(p)) for p in loc]
    if not parts:
        return "", None
    if len(parts) == 1:
        return parts[0], None  # every top-level key of a plan is a section
    section, rest = parts[0], parts[1:]
    key = ""
    for part in rest:
        if part.isdigit():
            key += f"[{part}]"
        else:
            key += f".{part}" if key else part
    return section, key


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The schema model that owns the last element of ``loc``, to list valid keys."""
    model: Any = Plan
    for part in loc[:-1]:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            return None
        annotation = field.annotation
        nested = _first_model(annotation)
        if nested is None:
            return None
        model = nested
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def did_you_mean(value: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def issues_from_validation(
    exc: ValidationError,
    *,
    path: str,
    model: type[BaseModel] | None = None,
    section: str | None = None,
    prefix: Sequence[str] = (),
    owner: str | None = None,
) -> list[PlanIssue]:
    """Translate pydantic errors into located plan issues with valid keys and suggestions.

    ``model``/``section``/``prefix`` locate errors from a component's own config schema;
    ``owner`` names that component (``loss 'dppo-tv'``).
    """
    issues: list[PlanIssue] = []
    for error in exc.errors():
        loc = list(prefix) + [str(p) for p in error["loc"]]
        if section is not None:
            shown = [*prefix, *(p if p.isdigit() else _toml_key(p) for p in loc[len(prefix) :])]
            sec, key = section, ".".join(shown) if loc else None
            key = key.replace(".[", "[") if key else key
        else:
            sec, key = _split_location(loc)
        value = error.get("input")
        kind = error["type"]
        last = str(loc[-1]) if loc else ""
        if kind == "extra_forbidden":
            owner_model = model if model is not None else _model_at(loc)
            valid = sorted(owner_model.model_fields) if owner_model is not None else []
            if section is None and len(loc) == 1:
                sections = sorted(Plan.model_fields)
                guess = did_you_mean(last, sections)
                issues.append(
                    PlanIssue(
                        path=path,
                        section=_toml_key(last),
                        key=None,
                        value=last,
                        message=f"unknown section [{_toml_key(last)}]"
                        + (f"; did you mean [{guess}]?" if guess else ""),
                        hint="valid sections: " + ", ".join(f"[{s}]" for s in sections),
                    )
                )
                continue
            what = f"{owner} has no key {last!r}" if owner else f"unknown key {last!r}"
            guess = did_you_mean(last, valid)
            if guess:
                what += f"; did you mean {guess!r}?"
            hint = (
                ("valid keys: " + ", ".join(valid)) if valid else f"{owner or 'it'} takes no keys"
            )
            issues.append(
                PlanIssue(path=path, section=sec, key=key, value=last, message=what, hint=hint)
            )
            continue
        shown = value if isinstance(value, (str, int, float, bool)) else None
        owner_model = model if model is not None else _model_at(loc)
        field_loc = [str(p) for p in error["loc"]] if model is not None else loc
        hint = _value_hint(owner_model, field_loc, kind)
        message = error["msg"]
        if shown is not None and kind != "missing":
            message = f"{message} (got {shown!r})"
        if owner:
            message = f"{owner}: {message}"
        issues.append(
            PlanIssue(
                path=path, section=sec, key=key or None, value=shown, message=message, hint=hint
            )
        )
    return issues


def _value_hint(owner: type[BaseModel] | None, loc: Sequence[str], kind: str) -> str | None:
    """What to do about a bad or missing value of a known field: its default, if it has one."""
    if owner is None or not loc or (model_field := owner.model_fields.get(loc[-1])) is None:
        return None
    if _first_model(model_field.annotation) is not None:
        return None  # a whole section: its own message says which keys clash
    if kind == "missing":
        return "add it"
    if model_field.is_required():
        return "fix the value"
    default = model_field.get_default(call_default_factory=True)
    if default is None:
        return "fix the value, or remove the key to leave it unset"
    if isinstance(default, bool):
        shown = "true" if default else "false"
    elif isinstance(default, str):
        shown = json.dumps(default)
    elif isinstance(default, (int, float)):
        shown = repr(default)
    else:
        return "fix the value, or remove the key for its default"
    return f"fix the value, or remove the key for the default {shown}"


def parse_plan(data: Mapping[str, Any], *, path: str = "<plan>") -> Plan:
    """Validate raw plan data against the core schema (component keys are checked later)."""
    try:
        return Plan.model_validate(dict(data))
    except ValidationError as exc:
        raise PlanError(issues_from_validation(exc, path=path)) from None


def load_plan(
    path: str | Path, overrides: Sequence[str] = (), *, manager: PluginManager | None = None
) -> tuple[Plan, dict[str, Any]]:
    """Read, override and validate a plan file; returns the model and the raw data, with
    relative paths made absolute (see the module docstring): those of the file against the
    plan's folder, those of ``overrides`` against the working directory.

    ``manager`` (default: the process-wide one) tells which keys of a component are paths.
    """
    label = str(path)
    data = read_plan_file(path)
    data = apply_overrides(data, overrides, path=label)
    set_keys = [tuple(p.strip() for p in item.partition("=")[0].split(".")) for item in overrides]
    data = resolve_plan_paths(
        data,
        Path(path).absolute().parent,
        manager=manager,
        overridden=lambda key: any(key[: len(s)] == s for s in set_keys),
    )
    return parse_plan(data, path=label), data


# ---------------------------------------------------------------- paths relative to the plan


def resolve_plan_paths(
    data: Mapping[str, Any],
    folder: Path,
    *,
    manager: PluginManager | None = None,
    overridden: Callable[[_Key], bool] = lambda key: False,
) -> dict[str, Any]:
    """A copy of raw plan ``data`` whose relative path values are absolute: against
    ``folder``, or against the working directory for a key ``overridden`` says came from the
    command line. A component the manager cannot find keeps its keys as written (resolving the
    plan reports it)."""
    data = copy.deepcopy(dict(data))
    cwd = Path.cwd()

    def base(key: _Key) -> Path:
        return cwd if overridden(key) else folder

    for section, key in CORE_PATH_KEYS:
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            table[key] = _rebase_value(table[key], Path, (), base((section, key)))
    for section_name, field in Plan.model_fields.items():
        table = data.get(section_name)
        model = field.annotation if isinstance(field.annotation, type) else None
        if isinstance(table, dict) and model is not None and issubclass(model, BaseModel):
            _rebase_model(table, model, (section_name,), base)
    components = list(_components(data))
    if components:
        if manager is None:
            from rllm_core.plugins.manager import get_plugin_manager

            manager = get_plugin_manager()
        for kind, table, key in components:
            name = table.get("name")
            if not isinstance(name, str):
                continue
            try:
                config = manager.get_record(kind, name).spec.config
            except ComponentError:
                continue
            _rebase_model(table, config, key, base)
    return data


def _components(data: dict[str, Any]) -> Iterable[tuple[Kind, dict[str, Any], _Key]]:
    """Each component table of raw plan data with its kind and key path (bare names have no
    keys to resolve)."""
    algorithm = data.get("algorithm")
    if isinstance(algorithm, dict):
        advantage = algorithm.get("advantage")
        if isinstance(advantage, dict) and isinstance(advantage.get("teacher"), dict):
            # Before the estimator's own table, whose rebasing copies this one.
            yield Kind.TRAINER_BACKEND, advantage["teacher"], ("algorithm", "advantage", "teacher")
        for key, kind in (("loss", Kind.LOSS), ("advantage", Kind.ADVANTAGE_ESTIMATOR)):
            if isinstance(algorithm.get(key), dict):
                yield kind, algorithm[key], ("algorithm", key)
        aux = algorithm.get("aux_losses")
        if isinstance(aux, list):
            for index, table in enumerate(aux):
                if isinstance(table, dict):
                    yield Kind.LOSS, table, ("algorithm", "aux_losses", index)
    for section, kind in COMPONENT_SECTIONS.items():
        if isinstance(data.get(section), dict):
            yield kind, data[section], (section,)
    loggers = data.get("loggers")
    if isinstance(loggers, list):
        for index, table in enumerate(loggers):
            if isinstance(table, dict):
                yield Kind.LOGGER, table, ("loggers", index)
    scheduler = data.get("scheduler")
    if isinstance(scheduler, dict) and isinstance(scheduler.get("launcher"), dict):
        yield Kind.TRAINER_LAUNCHER, scheduler["launcher"], ("scheduler", "launcher")


def _rebase_model(
    table: dict[str, Any], model: type[BaseModel], key: _Key, base: Callable[[_Key], Path]
) -> None:
    for name, field in model.model_fields.items():
        written = field.alias or name
        if written in table:
            here = (*key, written)
            table[written] = _rebase_value(
                table[written], field.annotation, field.metadata, base(here), here, base
            )


def _rebase_value(
    value: Any,
    annotation: Any,
    metadata: Sequence[Any],
    folder: Path,
    key: _Key = (),
    base: Callable[[_Key], Path] | None = None,
) -> Any:
    """``value`` with its relative paths taken against ``folder``, as ``annotation`` (and the
    ``metadata`` of an ``Annotated`` around it) declares them."""
    marker = next((m for m in metadata if isinstance(m, PlanPath)), None)
    if marker is not None or (isinstance(annotation, type) and issubclass(annotation, PurePath)):
        or_name = marker is not None and marker.or_name
        if isinstance(value, str):
            return _rebase(value, folder, or_name=or_name)
        if marker is not None and isinstance(value, list):  # a mark on a list marks each item
            return [_rebase(v, folder, or_name=or_name) if isinstance(v, str) else v for v in value]
        if marker is not None and isinstance(value, dict):  # and on a map, each value
            return {
                k: _rebase(v, folder, or_name=or_name) if isinstance(v, str) else v
                for k, v in value.items()
            }
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _rebase_value(value, args[0], args[1:], folder, key, base)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is not type(None) and _declares_path(arg):
                return _rebase_value(value, arg, (), folder, key, base)
        return value
    if origin in (list, tuple, set, frozenset, Sequence) and isinstance(value, list) and args:
        return [_rebase_value(item, args[0], (), folder, key, base) for item in value]
    if origin in (dict, Mapping) and isinstance(value, dict) and len(args) == 2:
        return {k: _rebase_value(v, args[1], (), folder, key, base) for k, v in value.items()}
    if (
        isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
        and isinstance(value, dict)
        and base is not None
    ):
        _rebase_model(value, annotation, key, base)
    return value


def _declares_path(annotation: Any) -> bool:
    if isinstance(annotation, type):
        return issubclass(annotation, (PurePath, BaseModel))
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Annotated:
        return any(isinstance(m, PlanPath) for m in args[1:]) or _declares_path(args[0])
    return any(_declares_path(arg) for arg in args)


def _rebase(value: str, folder: Path, *, or_name: bool) -> str:
    """``value`` taken relative to ``folder`` when it is a relative path; else as written."""
    if not value or os.path.isabs(value) or value.startswith("~") or "://" in value:
        return value
    joined = os.path.normpath(os.path.join(folder, value))
    if or_name and not (
        value in (".", "..")
        or value.startswith(("./", "../"))
        or ("/" in value and os.path.exists(joined))
    ):
        return value
    return joined
