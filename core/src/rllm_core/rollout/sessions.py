"""Gateway session ids of rollouts: :class:`SessionKey` encodes one and parses it back.

A rollout attempt's session id is ``{run}-s{step}-{task}-{index}-a{attempt}`` made safe for the
gateway (:func:`~rllm_core.gateway.engine.is_session_id`): characters other than letters,
digits and ``._:@-`` become ``_``, and the run part gets an ``r`` in front when it would not
start with a letter or digit. Every reader of session ids (resume cleanup, per-rollout seeds)
goes through :meth:`SessionKey.parse`, so none compares the raw run id with its safe form.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from rllm_core.gateway.engine import MAX_SESSION_ID

__all__ = ["MAX_SESSION_ID", "SessionKey", "rollout_session_id"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")
_TAIL = re.compile(r"-s(?P<step>\d+)-(?P<task>.+)-(?P<index>\d+)-a(?P<attempt>\d+)")
_DIGEST = 16
_MAX_RUN = 128
"""The safe run part keeps at most this many characters (a longer one ends with a hash), so
every id leaves room for its step, task, index and attempt."""


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST]


def _shorten(safe: str, raw: str, limit: int) -> str:
    """``safe`` when it fits in ``limit`` characters, else its head, ``.`` and a hash of
    ``raw`` (so distinct long values stay distinct)."""
    if len(safe) <= limit:
        return safe
    return f"{safe[: limit - _DIGEST - 1]}.{_digest(raw)}"


def _run_part(run: str) -> str:
    safe = _safe(run)
    if not safe[:1].isalnum():
        safe = "r" + safe
    return _shorten(safe, run, _MAX_RUN)


@dataclass(frozen=True, slots=True)
class SessionKey:
    """Which rollout attempt a gateway session belongs to.

    Contract: :meth:`encode` returns an id the gateway accepts, distinct for distinct keys
    (unless two task ids differ only in unsafe characters), and the same for the same key in
    every process; ``SessionKey.parse(key.encode(), run=key.run)`` returns the key with its
    ``task`` as encoded (see :meth:`parse`).
    """

    run: str
    step: int
    task: str
    index: int
    attempt: int

    def __post_init__(self) -> None:
        if min(self.step, self.index, self.attempt) < 0:
            raise ValueError(f"step, index and attempt must be non-negative: {self!r}")

    def encode(self) -> str:
        """The session id; a task part too long for :data:`MAX_SESSION_ID` keeps its head and
        ends with ``.`` and a hash of the task id."""
        head = f"{_run_part(self.run)}-s{self.step}-"
        tail = f"-{self.index}-a{self.attempt}"
        task = _shorten(_safe(self.task), self.task, MAX_SESSION_ID - len(head) - len(tail))
        return f"{head}{task}{tail}"

    def tail(self) -> str:
        """The encoded id without its run part: what identifies the rollout inside its run."""
        return self.encode().removeprefix(_run_part(self.run))

    @classmethod
    def parse(cls, session_id: str, *, run: str) -> SessionKey | None:
        """The key of ``session_id`` when it is a session of run ``run``, else None.

        ``run`` is the run id as given to :meth:`encode` (its safe form is derived here); the
        parsed key's ``run`` is ``run`` and its ``task`` is the task part as encoded (equal to
        the task id when that is safe and short).
        """
        head = _run_part(run)
        if not session_id.startswith(head):
            return None
        match = _TAIL.fullmatch(session_id, len(head))
        if match is None:
            return None
        return cls(
            run=run,
            step=int(match["step"]),
            task=match["task"],
            index=int(match["index"]),
            attempt=int(match["attempt"]),
        )


def rollout_session_id(run_id: str, step: int, task_id: str, index: int, attempt: int) -> str:
    """``SessionKey(run_id, step, task_id, index, attempt).encode()``."""
    return SessionKey(run_id, step, task_id, index, attempt).encode()
