"""Gateway session ids of rollouts, and forgetting a finished session."""

from __future__ import annotations

import hashlib
import re
from typing import Any

__all__ = ["MAX_SESSION_ID", "release_session", "rollout_session_id"]

MAX_SESSION_ID = 256
"""The gateway accepts session ids of at most this many characters."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")


def rollout_session_id(run_id: str, step: int, task_id: str, index: int, attempt: int) -> str:
    """``{run_id}-s{step}-{task_id}-{index}-a{attempt}`` made safe for the gateway.

    Characters other than letters, digits and ``._:@-`` become ``_``; an id that would not
    start with a letter or digit gets an ``r`` in front; one longer than
    :data:`MAX_SESSION_ID` keeps its head and ends with a hash of the whole id, so distinct
    rollouts keep distinct ids.
    """
    raw = f"{run_id}-s{step}-{task_id}-{index}-a{attempt}"
    safe = _UNSAFE.sub("_", raw)
    if not safe[0].isalnum():
        safe = "r" + safe
    if len(safe) > MAX_SESSION_ID:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
        safe = f"{safe[: MAX_SESSION_ID - len(digest) - 1]}-{digest}"
    return safe


def release_session(gateway: Any, session_id: str) -> None:
    """Drop the gateway's live state of a finished session; the trace store keeps its traces
    (``GatewayEngine.delete_session`` would delete those too)."""
    gateway.engine.release_session(session_id)
