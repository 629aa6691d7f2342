"""A griffe extension for the documentation site (``mkdocs.yml`` loads it): the docstrings of
rllm-core use reStructuredText's inline markup (``:class:`~pkg.Name```, ``Example::``), which
mkdocstrings would render as Markdown verbatim. This rewrites those bits as Markdown: a role
becomes a code span of its target (the last name alone after ``~``), and a paragraph ending in
``::`` ends in ``:`` (the indented block after it is a code block in Markdown too)."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?P<short>~?)(?P<target>[^`]+)`")
_LITERAL = re.compile(r"(?m)(?P<lead>\S)?::$")


def _role(match: re.Match[str]) -> str:
    target = match["target"]
    return f"`{target.rpartition('.')[2] if match['short'] else target}`"


def markdown(text: str) -> str:
    """``text`` with its reStructuredText roles and literal-block markers made Markdown."""
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(lambda m: f"{m['lead']}:" if m["lead"] else "", text)


class RstInline(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
