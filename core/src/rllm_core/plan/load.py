"""Reading ``plan.toml``: parsing, ``--set`` overrides and schema validation with located errors."""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rllm_core.errors import PlanError, PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["apply_overrides", "issues_from_validation", "load_plan", "parse_plan", "read_plan_file"]


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
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
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
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *, path: str) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides; values parse as TOML, else as plain strings.

    A key that selects a component by a bare name (``algorithm.loss = "x"``) turns into a table
    when an override sets one of its keys (``algorithm.loss.delta=0.2``).
    """
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        parts = [p.strip() for p in dotted.split(".")] if sep else []
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


def _split_location(loc: Sequence[int | str]) -> tuple[str, str | None]:
    """Turn a pydantic error location into (section, key) as a user reads the file."""
    parts = [str(p) for p in loc]
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
            sec, key = section, ".".join(loc) if loc else None
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
                        section=last,
                        key=None,
                        value=last,
                        message=f"unknown section [{last}]"
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


def load_plan(path: str | Path, overrides: Sequence[str] = ()) -> tuple[Plan, dict[str, Any]]:
    """Read, override and validate a plan file; returns the model and the raw data."""
    label = str(path)
    data = read_plan_file(path)
    data = apply_overrides(data, overrides, path=label)
    return parse_plan(data, path=label), data
