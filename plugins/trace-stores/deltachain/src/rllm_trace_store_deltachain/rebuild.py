"""Rebuilding full prompts from delta-chain records, and the order traces are returned in.

Both stores hand their records to :func:`rebuild_prompts`, which works whatever order the
records landed in, walks chains with a loop (a 1,000-turn chain needs no recursion) and visits
each record once.

Cost: each record's prompt is one slice of a shared token line. A record extends its parent's
line in place when no sibling has extended it yet, so a chain without forks builds a single line
and every prompt is a copy of its beginning; a fork copies the parent's line once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rllm_core.types import Trace, TraceRecord

__all__ = ["order_key", "rebuild_prompts", "to_traces"]


def order_key(record: TraceRecord) -> tuple[str, int, str]:
    """Lineage, then turn, then trace id: forks sharing a turn keep one stable order."""
    return (record.lineage_id, record.turn, record.trace_id)


class _Built:
    __slots__ = ("complete", "line", "prompt_end", "stream_end")

    def __init__(self, line: list[int], prompt_end: int, stream_end: int, complete: bool) -> None:
        self.line = line
        self.prompt_end = prompt_end
        self.stream_end = stream_end
        self.complete = complete


def rebuild_prompts(
    records: Mapping[str, TraceRecord],
    snapshots: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, tuple[list[int], bool]]:
    """The full prompt of every record in ``records`` (keyed by trace id), with whether it is
    complete.

    A root's prompt is its delta; a child's is its parent's prompt, then the parent's completion,
    then its own delta. ``snapshots`` maps a trace id to a full prompt known to be current; such
    a record needs no ancestor. When an ancestor is missing (or the parents form a loop) the
    prompt holds only the tokens after the gap and is flagged incomplete: nothing is invented.
    Every returned list is new.
    """
    snapshots = snapshots or {}
    built: dict[str, _Built] = {}
    for start in records:
        if start in built:
            continue
        path: list[TraceRecord] = []
        on_path: set[str] = set()
        cursor: str | None = start
        while cursor is not None and cursor not in built:
            record = records.get(cursor)
            if record is None or cursor in on_path:
                break
            path.append(record)
            on_path.add(cursor)
            if cursor in snapshots:
                break
            cursor = record.parent_trace_id
        for record in reversed(path):
            built[record.trace_id] = _extend(record, built, snapshots)
    return {
        trace_id: (state.line[: state.prompt_end], state.complete)
        for trace_id, state in built.items()
    }


def _extend(
    record: TraceRecord, built: Mapping[str, _Built], snapshots: Mapping[str, Sequence[int]]
) -> _Built:
    snapshot = snapshots.get(record.trace_id)
    if snapshot is not None:
        line, complete = list(snapshot), True
    elif record.parent_trace_id is None:
        line, complete = list(record.prompt_delta_token_ids), True
    else:
        parent = built.get(record.parent_trace_id)
        if parent is None:
            line, complete = list(record.prompt_delta_token_ids), False
        else:
            if len(parent.line) == parent.stream_end:
                line = parent.line
            else:
                line = parent.line[: parent.stream_end]
            line += record.prompt_delta_token_ids
            complete = parent.complete
    prompt_end = len(line)
    line += record.completion_token_ids
    return _Built(line, prompt_end, len(line), complete)


def to_traces(
    records: Iterable[TraceRecord], prompts: Mapping[str, tuple[list[int], bool]]
) -> list[Trace]:
    """``records`` (already in order) as traces with their rebuilt prompts."""
    traces = []
    for record in records:
        prompt, complete = prompts[record.trace_id]
        traces.append(Trace(record=record, prompt_token_ids=prompt, chain_complete=complete))
    return traces
