"""Chat JSONL rows for SFT from elsewhere: an evaluation's attempts, or another dataset.

:func:`eval_rows` turns the scored attempts of an ``rllm-core eval`` folder (its
``episodes.jsonl`` and trace store, read as ``rllm-core traces show`` reads them) into
conversations: one row per lineage segment of an attempt (a lineage, cut where the gateway
started a new chain), its messages as the gateway stored them with each call (the request's
new messages, then the reply), an assistant's thinking as ``reasoning_content``.

:func:`import_rows` reads a chat JSONL file and bridges the two ways thinking is written: in
the assistant's content between ``<think>`` and ``</think>`` (as many datasets keep it), or in
a separate ``reasoning_content`` field (as the SFT reader and the renderers take it).

Every row written is one :func:`~rllm_core.sft.data.chat_example` accepts, so it loads into
``rllm-core sft``; a row that could not be is refused with its file and line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.sft.data import DataError, chat_example
from rllm_core.types import Message

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "EvalRowsReport",
    "ImportReport",
    "eval_rows",
    "import_rows",
    "join_think",
    "message_row",
    "split_think",
    "write_rows",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_FIELDS = {"messages_field": "messages", "tools_field": "tools"}


def message_row(message: Message) -> dict[str, Any]:
    """``message`` in the OpenAI chat shape the SFT reader takes: ``role``, ``content``, and
    when set ``reasoning_content``, ``tool_calls`` (``{id, type, function: {name,
    arguments}}``), ``tool_call_id`` and ``name``."""
    row: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        row["reasoning_content"] = message.reasoning
    if message.tool_calls:
        row["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        row["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        row["name"] = message.name
    return row


def write_rows(rows: Iterable[Mapping[str, Any]], out: Path) -> int:
    """Write ``rows`` as JSONL to ``out`` (through a temporary file renamed at the end, so a
    failure leaves no half file); returns how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    count = 0
    try:
        with partial.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return count


# --------------------------------------------------------------------------------------------
# From an evaluation
# --------------------------------------------------------------------------------------------


@dataclass
class EvalRowsReport:
    """What :func:`eval_rows` took: ``attempts`` read, ``kept`` (reward at least the
    threshold), ``rows`` written; ``below`` attempts under the threshold; ``unlabelled``
    attempts whose calls were stored without messages and ``incomplete`` those missing a
    trace (both skipped; ``first_skipped`` names the first of each, by those names)."""

    attempts: int = 0
    kept: int = 0
    rows: int = 0
    below: int = 0
    unlabelled: int = 0
    incomplete: int = 0
    first_skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "kept": self.kept,
            "rows": self.rows,
            "below_min_reward": self.below,
            "without_messages": self.unlabelled,
            "missing_traces": self.incomplete,
        }

    def warnings(self) -> list[str]:
        out = []
        if self.unlabelled:
            out.append(
                f"{self.unlabelled} attempt(s) were stored without messages and were skipped"
                f" (first: {self.first_skipped['unlabelled']}): their tokens have no messages to"
                " write (`rllm-core traces show --raw` decodes them)"
            )
        if self.incomplete:
            out.append(
                f"{self.incomplete} attempt(s) miss traces in the trace store and were skipped"
                f" (first: {self.first_skipped['incomplete']})"
            )
        return out


def _open_folder(path: Path) -> Any:
    from rllm_core.inspection.runs import open_run_folder

    folder = open_run_folder(path)
    if not folder.episodes.is_file() and (folder.path / "results.jsonl").is_file():
        raise DataError(
            f"{folder.path} has results.jsonl but no episodes.jsonl: an older `rllm-core eval`"
            " wrote it, without the attempts' session ids; evaluate again to export its attempts"
        )
    return folder


def _segments(refs: list[Any]) -> tuple[list[tuple[str, list[Message]]], str | None]:
    """The conversations of an attempt's traces (``(lineage, trace_id, trace)`` in trajectory
    order, then call order), each with its lineage: a new one at every root (a trace without
    parent holds its whole request). The second value says why the attempt cannot be
    exported (``"unlabelled"``, ``"incomplete"``), or is None."""
    segments: list[tuple[str, list[Message]]] = []
    for lineage, _, trace in refs:
        if trace is None or not trace.chain_complete:
            return [], "incomplete"
        record = trace.record
        if not record.messages_delta:
            return [], "unlabelled"
        if record.parent_trace_id is None or not segments or segments[-1][0] != lineage:
            segments.append((lineage, []))
        segments[-1][1].extend(record.messages_delta)
    return segments, None


def eval_rows(
    path: str | Path, *, min_reward: float | None = None, report: EvalRowsReport | None = None
) -> Iterator[dict[str, Any]]:
    """The chat rows of the scored attempts of the evaluation (or run) folder ``path`` with
    reward at least ``min_reward`` (all when None), in ``episodes.jsonl`` order: ``messages``
    plus ``episode_id``, ``task_id``, ``reward`` and ``lineage_id``, where they came from.
    Counts go to ``report``.

    Raises :class:`~rllm_core.inspection.InspectionError` when ``path`` is not such a folder or
    its trace store cannot be opened, and :class:`DataError` for an evaluation folder written
    before evaluations kept ``episodes.jsonl``."""
    from rllm_core.inspection.conversation import open_trace_store, read_traces
    from rllm_core.inspection.episodes import read_episodes

    report = report if report is not None else EvalRowsReport()
    folder = _open_folder(Path(path))
    records = read_episodes(folder)
    store = open_trace_store(folder)
    try:
        for record in records:
            report.attempts += 1
            reward = record.get("reward")
            if min_reward is not None and (reward is None or float(reward) < min_reward):
                report.below += 1
                continue
            episode_id = str(record.get("episode_id"))
            segments, skipped = _segments(read_traces(store, record, folder=folder))
            if skipped is not None:
                setattr(report, skipped, getattr(report, skipped) + 1)
                report.first_skipped.setdefault(skipped, episode_id)
                continue
            report.kept += 1
            for lineage, messages in segments:
                row = {
                    "messages": [message_row(m) for m in messages],
                    "episode_id": episode_id,
                    "task_id": record.get("task_id"),
                    "reward": reward,
                    "lineage_id": lineage,
                }
                chat_example(row, f"{folder.path} episode {episode_id}", **_FIELDS)
                report.rows += 1
                yield row
    finally:
        store.close()


# --------------------------------------------------------------------------------------------
# The think-tag bridge
# --------------------------------------------------------------------------------------------


def split_think(content: str, where: str) -> tuple[str | None, str]:
    """``(reasoning, content)`` of an assistant's content that may hold its thinking between
    ``<think>`` and ``</think>``: the reasoning stripped of the newlines around it, the rest of
    the newlines before it; ``(None, content)`` without a think block. A ``</think>`` without
    an opening tag closes reasoning that starts the content (templates that put ``<think>``
    in the generation prompt write it so).

    Raises :class:`DataError` (``where`` names the message) for a ``<think>`` never closed,
    text before ``<think>``, or more than one think block."""
    opens, closes = content.count(THINK_OPEN), content.count(THINK_CLOSE)
    if not opens and not closes:
        return None, content
    if opens > 1 or closes > 1:
        raise DataError(
            f"{where}.content has {max(opens, closes)} think blocks; one, at the start of the"
            " content, is what a model writes: fix or drop the row"
        )
    if not closes:
        raise DataError(
            f"{where}.content opens {THINK_OPEN} but never closes it with {THINK_CLOSE} (a"
            " reply cut inside its thinking): fix or drop the row"
        )
    before, _, rest = content.partition(THINK_CLOSE)
    if opens:
        lead, _, before = before.partition(THINK_OPEN)
        if lead.strip():
            raise DataError(
                f"{where}.content has text before {THINK_OPEN} ({lead.strip()[:40]!r}); the"
                " think block must open the content: fix or drop the row"
            )
    return before.strip("\n"), rest.lstrip("\n")


def join_think(reasoning: str, content: str) -> str:
    """The content with ``reasoning`` as a think block before it, as Qwen3's template writes
    it: ``<think>\\n{reasoning}\\n</think>\\n\\n{content}``."""
    return f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{content}"


@dataclass
class ImportReport:
    """What :func:`import_rows` did: ``rows`` read, ``messages`` whose thinking it moved."""

    rows: int = 0
    messages: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "messages_converted": self.messages}


def _bridge(raw: dict[str, Any], message: Message, where: str, *, to_tags: bool) -> bool:
    """Rewrite the assistant message ``raw`` (read as ``message``) in place; True when its
    thinking moved."""
    reasoning = message.reasoning
    if to_tags:
        if reasoning is None:
            return False
        if THINK_OPEN in message.content or THINK_CLOSE in message.content:
            raise DataError(
                f"{where} has both reasoning_content and a think block in its content; keep one"
            )
        raw.pop("reasoning", None)
        raw.pop("reasoning_content", None)
        raw["content"] = join_think(reasoning, message.content)
        return True
    found, content = split_think(message.content, where)
    if found is None:
        return False
    if reasoning is not None:
        raise DataError(
            f"{where} has both reasoning_content and a think block in its content; keep one"
        )
    raw.pop("reasoning", None)
    raw["content"] = content
    raw["reasoning_content"] = found
    return True


def import_rows(
    path: str | Path,
    *,
    messages_field: str = "messages",
    tools_field: str = "tools",
    to_think_tags: bool = False,
    report: ImportReport | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows of the chat JSONL file ``path``, each assistant message's thinking moved out of
    its content's think block into ``reasoning_content`` (or, with ``to_think_tags``, from
    ``reasoning_content`` or ``reasoning`` into a think block before its content). Messages are
    written under ``messages`` and tools under ``tools`` whatever the fields read; every other
    key of a row and of a message is kept. Counts go to ``report``.

    Raises :class:`DataError` naming the file and line for a row that is not JSON, one the SFT
    reader refuses, and a malformed think block (see :func:`split_think`)."""
    report = report if report is not None else ImportReport()
    source = Path(path)
    if not source.is_file():
        raise DataError(f"{source} does not exist; pass a chat JSONL file")
    fields = {"messages_field": messages_field, "tools_field": tools_field}
    with source.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            origin = f"{source}:{number}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{origin}: not JSON: {exc}") from None
            example = chat_example(record, origin, **fields)
            raws = record.pop(messages_field)
            tools = record.pop(tools_field, None)
            for n, (raw, message) in enumerate(zip(raws, example.messages, strict=True)):
                if message.role == "assistant":
                    where = f"{origin}: {messages_field}[{n}]"
                    report.messages += _bridge(raw, message, where, to_tags=to_think_tags)
            row = {"messages": raws, **({"tools": tools} if tools is not None else {}), **record}
            chat_example(row, origin, **_FIELDS)
            report.rows += 1
            yield row
