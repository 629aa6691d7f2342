"""The tail of a command's output, as error messages quote it."""

from __future__ import annotations

__all__ = ["output_tail"]

TAIL_CHARS = 2000


def output_tail(stdout: str, stderr: str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of a command's output, stderr after stdout."""
    text = "\n".join(part for part in (stdout.rstrip(), stderr.rstrip()) if part)
    return text[-limit:]
