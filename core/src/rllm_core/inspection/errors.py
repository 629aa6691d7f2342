"""The one error type of run inspection."""

from __future__ import annotations

from rllm_core.errors import RllmError

__all__ = ["InspectionError"]


class InspectionError(RllmError):
    """A run folder cannot be read as asked: not a run folder, a record file missing, an
    unknown episode, a trace store that is missing or cannot be opened. The message is one line
    naming the path and what to do."""
