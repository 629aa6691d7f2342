"""Prompt templates in ``str.format`` syntax, checked against the placeholders a key allows."""

from __future__ import annotations

import string
from collections.abc import Iterable

__all__ = ["template_fields"]


def template_fields(template: str, allowed: Iterable[str], key: str, *, hint: str = "") -> set[str]:
    """The ``{name}`` placeholders of ``template``.

    Raises ``ValueError`` naming ``key`` when the template is not valid ``str.format`` syntax
    or uses a placeholder outside ``allowed``; ``hint`` is added to the latter message (how to
    write a literal that looks like a placeholder in this key's language, say).
    """
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(
            f"{key} is not a valid template ({exc}); write literal braces as {{{{ and }}}}"
        ) from None
    allowed = tuple(allowed)
    for name in sorted(names):
        if name not in allowed:
            raise ValueError(
                f"{key} uses the placeholder {{{name}}}, which is not one of "
                + ", ".join(f"{{{a}}}" for a in allowed)
                + "; write literal braces as {{ and }}"
                + hint
            )
    return names
