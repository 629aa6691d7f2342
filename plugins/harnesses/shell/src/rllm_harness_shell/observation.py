"""What the model sees of a command: its output joined and cut to a character budget."""

from __future__ import annotations

from rllm_core.types import ExecResult

__all__ = ["command_output", "truncate_middle"]


def command_output(result: ExecResult) -> str:
    """stdout followed by stderr (a newline between them when stdout does not end with one).
    A backend that merges the streams has everything in stdout already."""
    if not result.stderr:
        return result.stdout
    if result.stdout and not result.stdout.endswith("\n"):
        return f"{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def truncate_middle(text: str, limit: int, marker: str) -> tuple[str, int]:
    """Cut ``text`` to ``limit`` characters plus the marker, keeping its head and tail.

    Returns the text and how many characters were cut (0 when it fits). The head keeps
    ``ceil(limit / 2)`` characters, the tail ``floor(limit / 2)``; ``marker`` is a template
    whose ``{cut}`` is replaced by the number cut, and does not count against ``limit``.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1 character, got {limit}")
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    tail = limit // 2
    head = limit - tail
    return text[:head] + marker.format(cut=cut) + (text[-tail:] if tail else ""), cut
