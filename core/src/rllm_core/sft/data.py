"""Where SFT examples come from: chat JSONL, ``datasets`` files, or a run's episodes.

A chat example is an OpenAI-shaped conversation: ``messages`` (``role``, ``content``, an
assistant's ``tool_calls``, a tool message's ``tool_call_id``, a message's ``trainable``) and
optional ``tools`` (``{"type": "function", "function": {...}}``). Every error names the file,
the line or row and the field.

``trainable`` overrides, per message, the rule that assistant messages are trained: an
assistant message with ``"trainable": false`` stays in the context but trains no token. Only
assistant messages can be trained (in a run the model writes nothing else), so ``true`` on any
other role is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_core.types import Message, ToolCall, ToolSpec

__all__ = [
    "DATASET_SUFFIXES",
    "ChatExample",
    "DataError",
    "TokenExample",
    "chat_example",
    "load_examples",
    "read_chat_jsonl",
    "read_dataset_files",
    "read_run_episodes",
]

DATASET_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
"""File suffixes ``datasets.load_dataset`` reads, with the builder that reads each."""


class DataError(Exception):
    """SFT data that cannot be read; the message names the file, the line or row and the key."""


@dataclass(frozen=True)
class ChatExample:
    """One conversation to render; ``origin`` says where it came from (``file:line``).
    ``untrained`` holds the indices of the assistant messages marked ``"trainable": false``."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    origin: str
    untrained: frozenset[int] = frozenset()


@dataclass(frozen=True)
class TokenExample:
    """One example already in tokens: ``trained`` is true on the tokens the model learns
    (assistant content and its closing token)."""

    token_ids: tuple[int, ...]
    trained: tuple[bool, ...]
    origin: str


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_ROLES["tool"] = "tool"


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for n, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise DataError(f"{where}.content[{n}]: only text parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise DataError(f"{where}.content: expected text, got {type(content).__name__}")


def _tool_call(raw: Any, where: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise DataError(f"{where}: expected {{id, type, function: {{name, arguments}}}}")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=str(raw.get("id") or ""), name=function["name"], arguments=arguments)


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, Mapping):
        raise DataError(f"{where}: expected an object with role and content")
    role = _ROLES.get(str(raw.get("role")))
    if role is None:
        raise DataError(
            f"{where}.role is {raw.get('role')!r}; use system, developer, user, assistant or tool"
        )
    calls = raw.get("tool_calls") or ()
    if calls and role != "assistant":
        raise DataError(f"{where}: only assistant messages carry tool_calls")
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    return Message(
        role=role,  # type: ignore[arg-type]
        content=_text(raw.get("content"), where),
        reasoning=str(reasoning) if reasoning is not None and role == "assistant" else None,
        tool_calls=tuple(_tool_call(c, f"{where}.tool_calls[{n}]") for n, c in enumerate(calls)),
        tool_call_id=str(raw["tool_call_id"])
        if role == "tool" and raw.get("tool_call_id")
        else None,
        name=str(raw["name"]) if raw.get("name") else None,
    )


def _trainable(raw: Mapping[str, Any], where: str) -> bool:
    """Whether the message ``raw`` (already checked by :func:`_message`) is trained."""
    role = _ROLES[str(raw.get("role"))]
    flag = raw.get("trainable")
    if flag is None:
        return role == "assistant"
    if not isinstance(flag, bool):
        raise DataError(f"{where}.trainable is {flag!r} ({type(flag).__name__}); use true or false")
    if flag and role != "assistant":
        raise DataError(
            f"{where}.trainable is true on a {raw.get('role')} message; only assistant"
            " messages are trained (the model writes nothing else in a run): remove the key"
        )
    return flag


def _tool(raw: Any, where: str) -> ToolSpec:
    function = raw.get("function", raw) if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise DataError(f"{where}: expected {{type: function, function: {{name, ...}}}}")
    return ToolSpec(
        name=function["name"],
        description=str(function.get("description") or ""),
        parameters=dict(function.get("parameters") or {}),
    )


def chat_example(record: Any, origin: str, *, messages_field: str, tools_field: str) -> ChatExample:
    """A :class:`ChatExample` from one record (a JSON object or a dataset row)."""
    if not isinstance(record, Mapping):
        raise DataError(f"{origin}: expected an object with {messages_field!r}, got {record!r:.80}")
    if record.get(messages_field) is None:
        raise DataError(f"{origin}: no {messages_field!r} field (keys: {', '.join(record)})")
    raw_messages = _plain(record[messages_field])
    if not isinstance(raw_messages, list) or not raw_messages:
        raise DataError(f"{origin}: {messages_field!r} must be a non-empty list of messages")
    tools = record.get(tools_field)
    if isinstance(tools, str):  # datasets often keep nested JSON as text
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError as exc:
            raise DataError(f"{origin}: {tools_field!r} is text but not JSON: {exc}") from None
    tools = _plain(tools) or []
    if not isinstance(tools, list):
        raise DataError(f"{origin}: {tools_field!r} must be a list of tools")
    messages = tuple(
        _message(m, f"{origin}: {messages_field}[{n}]") for n, m in enumerate(raw_messages)
    )
    trained = [
        _trainable(m, f"{origin}: {messages_field}[{n}]") for n, m in enumerate(raw_messages)
    ]
    untrained = frozenset(
        n for n, m in enumerate(messages) if m.role == "assistant" and not trained[n]
    )
    specs = tuple(_tool(t, f"{origin}: {tools_field}[{n}]") for n, t in enumerate(tools))
    if not any(m.role == "assistant" for m in messages):
        raise DataError(
            f"{origin}: no assistant message; SFT trains on assistant turns, so each example"
            " needs at least one"
        )
    return ChatExample(messages=messages, tools=specs, origin=origin, untrained=untrained)


def _plain(value: Any) -> Any:
    """Nested dataset values as plain Python (lists, dicts), dropping keys whose value is None:
    an arrow struct column gives every row every key."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    return _plain(tolist()) if callable(tolist) else value


def read_chat_jsonl(path: Path, *, messages_field: str, tools_field: str) -> list[ChatExample]:
    """Every non-empty line of a chat JSONL file as an example."""
    out = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            origin = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{origin}: not JSON: {exc}") from None
            out.append(
                chat_example(record, origin, messages_field=messages_field, tools_field=tools_field)
            )
    return out


def read_dataset_files(
    files: Sequence[Path], *, messages_field: str, tools_field: str, key: str
) -> list[ChatExample]:
    """Rows of parquet, arrow or jsonl files read with ``datasets.load_dataset``."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"[sft].{key}: reading {files[0].name} needs the `datasets` package:"
            " pip install 'rllm-core[datasets]' (or pip install datasets), or give a chat"
            ' JSONL file with format = "chat-jsonl"'
        ) from None
    builders = {DATASET_SUFFIXES.get(f.suffix) for f in files}
    if None in builders or len(builders) != 1:
        raise DataError(
            f"[sft].{key}: {', '.join(str(f) for f in files)}: one kind of file at a time,"
            f" with a suffix among {', '.join(DATASET_SUFFIXES)}"
        )
    builder = builders.pop()
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
    except Exception as exc:
        raise DataError(f"[sft].{key}: datasets could not read {files[0]}: {exc}") from None
    if messages_field not in table.column_names:
        raise DataError(
            f"[sft].{key}: {files[0]} has no column {messages_field!r} (columns:"
            f" {', '.join(table.column_names)}); set [sft].messages_field"
        )
    name = files[0] if len(files) == 1 else files[0].parent
    return [
        chat_example(
            row, f"{name} row {index}", messages_field=messages_field, tools_field=tools_field
        )
        for index, row in enumerate(table)
    ]


def _files(path: Path, key: str) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in DATASET_SUFFIXES)
        if not found:
            raise DataError(
                f"[sft].{key}: the folder {path} holds no {', '.join(DATASET_SUFFIXES)} file"
            )
        return found
    if not path.is_file():
        raise DataError(
            f"[sft].{key}: {path} does not exist; check the path (relative to the plan)"
        )
    return [path]


def load_examples(
    path: str, *, format: str, messages_field: str, tools_field: str, key: str = "data"
) -> list[ChatExample]:
    """The examples of ``[sft].data`` (or ``eval_data``, ``key``) in ``format``."""
    files = _files(Path(path), key)
    chat = format == "chat-jsonl" or (format == "auto" and all(f.suffix == ".jsonl" for f in files))
    if chat:
        return [
            example
            for f in files
            for example in read_chat_jsonl(
                f, messages_field=messages_field, tools_field=tools_field
            )
        ]
    return read_dataset_files(
        files, messages_field=messages_field, tools_field=tools_field, key=key
    )


def read_run_episodes(run_dir: str, *, min_reward: float | None) -> Iterator[TokenExample]:
    """The trajectories of a run folder's episodes with reward at least ``min_reward`` (all
    when None), as the run's datums hold them: prompt and completion tokens from the run's
    trace store, prefix-merged, with the sampled tokens trained."""
    from rllm_core.algorithms import merge_trajectory, trajectories_from_traces
    from rllm_core.inspection.conversation import open_trace_store
    from rllm_core.inspection.episodes import read_episodes
    from rllm_core.inspection.errors import InspectionError
    from rllm_core.run.folder import RunFolder

    try:
        folder = RunFolder.existing(run_dir)
        records = read_episodes(folder)
        store = open_trace_store(folder)
    except (FileNotFoundError, InspectionError) as exc:
        raise DataError(f"[sft].from_run: {exc}") from None
    try:
        for record in records:
            reward = record.get("reward")
            if min_reward is not None and (reward is None or float(reward) < min_reward):
                continue
            traces = store.session(str(record.get("session_id")))
            origin = f"{folder.path} episode {record.get('episode_id')}"
            for trajectory in trajectories_from_traces(traces):
                for datum in merge_trajectory(trajectory, 0.0):
                    if any(datum.action_mask):
                        yield TokenExample(
                            token_ids=tuple(datum.token_ids),
                            trained=tuple(datum.action_mask),
                            origin=origin,
                        )
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
