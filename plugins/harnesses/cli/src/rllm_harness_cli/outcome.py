"""The outcome file an agent may write to say how its episode ended.

JSON object, UTF-8, at ``<agent_dir>/outcome.json`` (the agent finds the path in
``$RLLM_OUTCOME_PATH``)::

    {"termination": "max_turns", "turns": 12, "answer": "42", "metadata": {"cost": 0.1}}

``termination`` is required and is one of the values of
:class:`~rllm_core.types.Termination` (``done``, ``max_turns``, ``timeout``,
``context_length``, ``model_error``, ``sandbox_error``, ``verifier_error``). ``turns`` (a
non-negative integer), ``answer`` (a string) and ``metadata`` (an object) are optional; other
fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from rllm_core.types import Termination

__all__ = ["OUTCOME_FILE", "AgentOutcome", "parse_outcome"]

OUTCOME_FILE = "outcome.json"


class AgentOutcome(msgspec.Struct, kw_only=True, frozen=True):
    """What an agent reported in its outcome file."""

    termination: Termination
    turns: Annotated[int, msgspec.Meta(ge=0)] | None = None
    answer: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


def parse_outcome(data: bytes) -> AgentOutcome:
    """Decode an outcome file; raises ``ValueError`` saying what is wrong with it."""
    try:
        return msgspec.json.decode(data, type=AgentOutcome)
    except msgspec.ValidationError as exc:
        choices = ", ".join(t.value for t in Termination)
        raise ValueError(f"{exc} (termination is one of: {choices})") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
