"""Hypothesis strategies for TOML documents drawn from a pydantic schema, for the fuzz tests of
the plan and ``task.toml`` loaders. This module holds no tests.

:func:`schema_table` draws a table of a model's own keys (read from ``model_fields``, so the
documents follow the schema as it changes) with plausible values from the field types, each
at times replaced by :data:`JUNK` (any TOML value: huge ints, inf and nan, dates, unicode,
arrays, tables), plus at times an unknown key. :func:`file_bytes` turns documents into the
bytes of a file, sometimes cut, followed by junk bytes or replaced by bytes that are not
TOML or not UTF-8.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import tomli_w
from hypothesis import strategies as st
from pydantic import BaseModel

__all__ = [
    "JUNK",
    "JUNK_KEYS",
    "file_bytes",
    "plausible",
    "schema_table",
    "some_of",
    "with_junk_keys",
]

Override = Callable[[str, Any], "st.SearchStrategy[Any] | None"]
"""``(key, annotation)`` to a strategy for that field, or ``None`` for the default."""

JUNK_KEYS = st.text(max_size=12) | st.sampled_from(["name", "path", "x", " ", "é", "[/b]"])
_SCALARS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=2**63, max_value=2**80),
    st.floats(),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), -0.0, 1e308]),
    st.text(max_size=20),
    st.sampled_from(["", ".", "..", "/", "~/x", "s3://bucket/x", "\x00", "\u202e", "{x}", "[b]"]),
    st.booleans(),
    st.dates(),
    st.datetimes(),
    st.times(),
)
JUNK: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JUNK_KEYS, inner, max_size=3),
    max_leaves=6,
)
"""Any TOML value, nested a little."""


def plausible(annotation: Any, override: Override | None = None) -> st.SearchStrategy[Any]:
    """Values near what a field typed ``annotation`` accepts (its ``Literal`` choices, small
    and boundary numbers, short strings, tables of a nested model)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return plausible(args[0], override)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([plausible(a, override) for a in args if a is not type(None)])
    if origin in (list, tuple, set, frozenset) and args:
        return st.lists(plausible(args[0], override), max_size=3)
    if origin is dict and len(args) == 2:
        return st.dictionaries(JUNK_KEYS, plausible(args[1], override), max_size=3)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(min_value=-2, max_value=70) | st.sampled_from([2**63 - 1, 2**64])
    if annotation is float:
        return st.floats(min_value=-1, max_value=700) | st.sampled_from([0.0, float("nan")])
    if annotation is str or (isinstance(annotation, type) and issubclass(annotation, os.PathLike)):
        return st.text(max_size=12) | st.sampled_from(["runs", "./data", "/app", "gpt2", "1.0"])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return schema_table(annotation, override)
    return JUNK


def schema_table(
    model: type[BaseModel], override: Override | None = None
) -> st.SearchStrategy[dict[str, Any]]:
    """A table of ``model``'s keys (any subset, by alias where one is set), each value
    plausible or junk, sometimes with an unknown key; ``override`` picks the strategy of a
    field by its key."""
    known = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        chosen = override(key, field.annotation) if override is not None else None
        known[key] = (
            chosen if chosen is not None else plausible(field.annotation, override)
        ) | JUNK
    return with_junk_keys(some_of(known))


def some_of(
    fields: dict[str, st.SearchStrategy[Any]], max_keys: int = 4
) -> st.SearchStrategy[dict[str, Any]]:
    """A table of at most ``max_keys`` of ``fields``' keys, each with its strategy's value
    (few keys at a time keep each document cheap to draw)."""
    if not fields:
        return st.just({})
    keys = st.lists(st.sampled_from(sorted(fields)), max_size=max_keys, unique=True)
    return keys.flatmap(lambda chosen: st.fixed_dictionaries({k: fields[k] for k in chosen}))


def with_junk_keys(tables: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict]:
    """``tables`` with, at times, an unknown key of any value added."""
    junk = st.dictionaries(JUNK_KEYS, JUNK, max_size=1)
    return st.tuples(tables, junk).map(lambda parts: {**parts[1], **parts[0]})


def file_bytes(documents: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """The bytes of a file: mostly a document written as TOML, sometimes broken (junk bytes
    appended, a stray ``[`` inserted), sometimes any bytes or any text."""
    written = documents.map(lambda data: tomli_w.dumps(data).encode())
    return st.one_of(
        written,
        written,
        written,
        st.tuples(written, st.binary(max_size=8)).map(lambda p: p[0] + p[1]),
        written.flatmap(
            lambda text: st.integers(0, len(text)).map(lambda at: text[:at] + b"\n[" + text[at:])
        ),
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
    )
