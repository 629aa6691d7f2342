"""History breaks: how a request that does not extend its lineage rewrote the conversation.

Agents whose context outgrows the model's window truncate or summarize their history, so a later
request's messages no longer start with the previous call's request and reply (the *recorded*
messages). :func:`history_break` compares the two and says what happened:

- ``history_truncated``: messages were dropped at the first difference and the rest of the
  recorded conversation follows unchanged (``inserted`` 0);
- ``history_summarized``: a run of recorded messages holding at least one assistant turn was
  replaced by fewer new messages (the summary: a user message, an assistant one, or a pair),
  and whatever of the recorded conversation follows it is unchanged;
- ``history_edited``: any other rewrite (a message changed, the conversation rewound to an
  earlier point, the history replaced by a single new message).

The kept part is the longest run that ends with the recorded conversation's last message (the
model's last reply). Without one, a request that keeps a run from further back rewound the
conversation (an edit, what followed that run dropped); a request that keeps nothing after the
first difference is a summary or an edit of all of it: when it holds two or more new messages
there, the trailing non-assistant ones are the new input and the others, at least one, the
replacement.

A break is recorded on the call that starts the new root: its ``reset_reason`` is the reason
and its ``flags`` carry :meth:`HistoryBreak.flags` (``history_at=``, ``history_kept=``,
``history_dropped=``, ``history_inserted=`` and, for a new lineage, ``history_from=``), which
:meth:`HistoryBreak.from_record` reads back; records written before breaks were described carry
``prefix_changed`` and no such flags.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rllm_core.types import (
    HISTORY_EDITED,
    HISTORY_REASONS,
    HISTORY_SUMMARIZED,
    HISTORY_TRUNCATED,
)

__all__ = [
    "HISTORY_EDITED",
    "HISTORY_REASONS",
    "HISTORY_SUMMARIZED",
    "HISTORY_TRUNCATED",
    "HistoryBreak",
    "continuation",
    "history_break",
]


_PREFIX = "history_"
_COUNTS = ("at", "kept", "dropped", "inserted")


class HistoryBreak(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how a request rewrote the recorded conversation of a lineage.

    ``at`` is the index of the first message that differs (the ``at`` messages before it were
    kept as they were); ``kept`` and ``dropped`` count the recorded messages (the previous
    call's request and its reply) the request kept and left out, ``kept + dropped`` being all
    of them; ``inserted`` counts the new messages in place of the dropped ones (the summary;
    0 for a truncation). ``source`` is set when the request started a new lineage (its first
    message changed): the lineage whose conversation it continues.
    """

    reason: str
    at: int
    kept: int
    dropped: int
    inserted: int
    source: str | None = None

    def flags(self) -> tuple[str, ...]:
        """The break as ``TraceRecord.flags`` entries."""
        flags = tuple(f"{_PREFIX}{name}={getattr(self, name)}" for name in _COUNTS)
        return flags if self.source is None else (*flags, f"{_PREFIX}from={self.source}")

    @classmethod
    def from_record(cls, reason: str | None, flags: Sequence[str]) -> HistoryBreak | None:
        """The break a record's ``reset_reason`` and ``flags`` describe; ``None`` when the
        reason is not a history break or the flags do not describe one (an older record)."""
        if reason not in HISTORY_REASONS:
            return None
        values: dict[str, str] = {}
        for flag in flags:
            name, sep, value = flag.partition("=")
            if sep and name.startswith(_PREFIX):
                values[name.removeprefix(_PREFIX)] = value
        try:
            counts = {name: int(values[name]) for name in _COUNTS}
        except (KeyError, ValueError):
            return None
        return cls(reason=reason, source=values.get("from"), **counts)

    def describe(self) -> str:
        """One line for people, e.g. ``history_summarized (4 messages replaced by a 1-message
        summary, 3 kept)``."""
        dropped = _plural(self.dropped, "message")
        if self.reason == HISTORY_TRUNCATED:
            what = f"{dropped} dropped after message {self.at}"
        elif self.reason == HISTORY_SUMMARIZED:
            what = f"{dropped} replaced by a {self.inserted}-message summary"
        else:
            what = f"from message {self.at}: {dropped} replaced by {self.inserted}"
        origin = f", continuing lineage {self.source}" if self.source is not None else ""
        return f"{self.reason} ({what}, {self.kept} kept{origin})"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def history_break(
    recorded: Sequence[Any],
    incoming: Sequence[Any],
    at: int,
    *,
    same: Callable[[Any, Any], bool],
    role: Callable[[Any], str],
) -> HistoryBreak:
    """Classify ``incoming`` against ``recorded`` (see the module docstring).

    ``at`` is the first index where they differ (``len(incoming)`` when ``incoming`` is a
    strict prefix); ``same(old, new)`` says whether an incoming message matches a recorded one
    and ``role`` gives a message's role.
    """
    n = len(recorded)
    kept_run, offset = _kept_run(recorded, incoming, at, same)
    if kept_run:
        return _tail_kept(recorded, at, kept_run, offset, role=role, source=None)
    rewound, offset = _common_run(recorded, incoming, at, same)
    if rewound:
        return HistoryBreak(
            reason=HISTORY_EDITED,
            at=at,
            kept=at + rewound,
            dropped=n - at - rewound,
            inserted=offset,
        )
    dropped = n - at
    rest = incoming[at:]
    trailing = 0
    while trailing < len(rest) and role(rest[len(rest) - 1 - trailing]) != "assistant":
        trailing += 1
    inserted = max(1, len(rest) - trailing) if len(rest) >= 2 else len(rest)
    turns_dropped = any(role(m) == "assistant" for m in recorded[at:])
    summarized = len(rest) >= 2 and inserted < dropped and turns_dropped
    return HistoryBreak(
        reason=HISTORY_SUMMARIZED if summarized else HISTORY_EDITED,
        at=at,
        kept=at,
        dropped=dropped,
        inserted=inserted,
    )


def continuation(
    recorded: Sequence[Any],
    incoming: Sequence[Any],
    *,
    same: Callable[[Any, Any], bool],
    role: Callable[[Any], str],
    source: str,
) -> HistoryBreak | None:
    """The break by which ``incoming``, whose first message is not ``recorded``'s, continues
    the lineage ``source``: only when it keeps a run of ``recorded`` that ends with its last
    message (the lineage's last reply), else ``None``."""
    kept_run, offset = _kept_run(recorded, incoming, 0, same)
    if not kept_run:
        return None
    return _tail_kept(recorded, 0, kept_run, offset, role=role, source=source)


def _tail_kept(
    recorded: Sequence[Any],
    at: int,
    kept_run: int,
    offset: int,
    *,
    role: Callable[[Any], str],
    source: str | None,
) -> HistoryBreak:
    """The break of a request that keeps the last ``kept_run`` recorded messages, ``offset``
    messages after ``at``."""
    n = len(recorded)
    dropped = n - at - kept_run
    turns_dropped = any(role(m) == "assistant" for m in recorded[at : at + dropped])
    if offset == 0 and dropped > 0:
        reason = HISTORY_TRUNCATED
    elif 0 < offset < dropped and turns_dropped:
        reason = HISTORY_SUMMARIZED
    else:
        reason = HISTORY_EDITED
    return HistoryBreak(
        reason=reason,
        at=at,
        kept=n - dropped,
        dropped=dropped,
        inserted=offset,
        source=source,
    )


def _kept_run(
    recorded: Sequence[Any], incoming: Sequence[Any], at: int, same: Callable[[Any, Any], bool]
) -> tuple[int, int]:
    """The longest run of ``recorded[at:]`` ending with its last message that ``incoming[at:]``
    holds, and its offset in ``incoming[at:]`` (the smallest, between runs of one length);
    ``(0, 0)`` when there is none."""
    n = len(recorded)
    if n <= at:
        return 0, 0
    last = recorded[-1]
    best, best_offset = 0, 0
    for end in range(at, len(incoming)):
        if not same(last, incoming[end]):
            continue
        length = 1
        while (
            length < n - at
            and end - length >= at
            and same(recorded[n - 1 - length], incoming[end - length])
        ):
            length += 1
        if length > best:
            best, best_offset = length, end - length + 1 - at
    return best, best_offset


def _common_run(
    recorded: Sequence[Any], incoming: Sequence[Any], at: int, same: Callable[[Any, Any], bool]
) -> tuple[int, int]:
    """The longest run that ``recorded[at:]`` and ``incoming[at:]`` share anywhere, and its
    offset in ``incoming[at:]``; ``(0, 0)`` when they share no message."""
    old, new = recorded[at:], incoming[at:]
    best, best_offset = 0, 0
    previous = [0] * (len(new) + 1)
    for i in range(1, len(old) + 1):
        row = [0] * (len(new) + 1)
        for j in range(1, len(new) + 1):
            if same(old[i - 1], new[j - 1]):
                row[j] = previous[j - 1] + 1
                if row[j] > best:
                    best, best_offset = row[j], j - row[j]
        previous = row
    return best, best_offset
