"""Parsing TOML that anyone may have written (plans, ``task.toml``, ``dataset.toml``).

:func:`load_toml_text` is :func:`tomllib.loads` with a bound on how deep tables and arrays
nest. Without it a file of a few kilobytes (``a = [[[[...]]]]``, ``[a.a.a.a...]``) raises
``RecursionError`` in the parser or in whatever walks the data next (a deep copy, a schema
validator) instead of an error a reader can report against the file.
"""

from __future__ import annotations

import tomllib
from typing import Any

__all__ = ["MAX_TOML_NESTING", "TomlNestingError", "load_toml_text"]

MAX_TOML_NESTING = 32
"""The most tables and arrays one value may sit inside (``[a.b]`` / ``c = [[1]]`` is 4)."""


class TomlNestingError(ValueError):
    """Tables or arrays nest deeper than the bound; the message names the dotted key."""


def load_toml_text(text: str, *, max_nesting: int = MAX_TOML_NESTING) -> dict[str, Any]:
    """Parse ``text`` as TOML.

    Raises :class:`tomllib.TOMLDecodeError` for a syntax error and :class:`TomlNestingError`
    when tables or arrays nest more than ``max_nesting`` levels deep; both are
    :class:`ValueError`, so one ``except ValueError`` reports either.
    """
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise TomlNestingError(
            f"tables or arrays nest too deeply to parse (at most {max_nesting} levels)"
        ) from None
    deep = _too_deep(data, max_nesting)
    if deep is not None:
        raise TomlNestingError(
            f"tables or arrays nest more than {max_nesting} levels deep at {_dotted(deep)};"
            f" at most {max_nesting} are allowed"
        )
    return data


def _too_deep(data: dict[str, Any], limit: int) -> list[str | int] | None:
    """The key path of a value nested more than ``limit`` levels deep, or ``None``."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > limit:
            return path
        children = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in children:
            if isinstance(value, dict | list):
                stack.append((value, [*path, key]))
    return None


def _dotted(path: list[str | int]) -> str:
    shown = path[:6]
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in shown)
    return text.lstrip(".") + ("..." if len(path) > len(shown) else "")
