"""The rules every object store applies to keys (see :class:`rllm_core.ports.ObjectStore`).

One function, so that a directory, a bucket and an in-memory store refuse the same keys: a
plan that works against one store works against another.
"""

from __future__ import annotations

__all__ = ["MAX_SEGMENT_BYTES", "check_key", "is_key"]

MAX_SEGMENT_BYTES = 255
"""The longest segment in UTF-8 bytes: a filesystem's limit for one name."""


def check_key(key: str) -> tuple[str, ...]:
    """The ``/``-separated segments of ``key``; ``ValueError`` when it is not a valid key.

    Valid: a non-empty relative path whose segments are non-empty, not ``.`` or ``..``, free
    of NUL characters and at most 255 bytes long.
    """
    if not isinstance(key, str):
        raise ValueError(f"an object key must be a string, got {type(key).__name__} {key!r}")
    if not key or key.startswith("/"):
        raise ValueError(f"invalid object key {key!r}: use a non-empty relative path like 'a/b'")
    parts = tuple(key.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(
                f"invalid object key {key!r}: segment {part!r} is not allowed (no empty, '.'"
                " or '..' segments, no leading, trailing or doubled '/')"
            )
        if "\x00" in part:
            raise ValueError(f"invalid object key {key!r}: it contains a NUL character")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise ValueError(
                f"invalid object key {key!r}: segment {part[:20]!r}... is longer than"
                f" {MAX_SEGMENT_BYTES} bytes; shorten it"
            )
    return parts


def is_key(text: str) -> bool:
    """Whether ``text`` is a valid key (``check_key`` would accept it)."""
    try:
        check_key(text)
    except ValueError:
        return False
    return True
