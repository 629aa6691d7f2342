"""The OpenAI Responses API on the gateway's chat path: ``POST .../v1/responses``.

A request is turned into the same messages, tools and sampling parameters a chat completion
would carry, and served by :meth:`~rllm_core.gateway.engine.GatewayEngine.chat`, so a Responses
conversation renders, samples and records exactly as the equivalent chat conversation does
(and extends the same lineage).

Input: ``input`` is a string (one user message) or a list of items: messages (``role``
``system``, ``developer``, ``user`` or ``assistant``; ``content`` a string or
``input_text`` / ``output_text`` parts), ``function_call`` items (the assistant's calls, merged
into one assistant message with the message or reasoning before them), ``function_call_output``
items (tool results, by ``call_id``) and ``reasoning`` items (the assistant's thinking, from a
previous response's output). ``instructions`` becomes a leading system message.

Output: a ``reasoning`` item when the renderer separated thinking, a ``message`` item with one
``output_text`` part when the reply has text, one ``function_call`` item per tool call (its
``call_id`` is the chat completion's tool call id); ``usage``; ``status`` ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` when the reply hit the token limit.

Refused with a 400: ``previous_response_id`` (the gateway keeps no response objects: send the
whole conversation as input items), ``text.format`` other than ``text``, tools other than
``function``, content parts other than text, and unknown item types. ``stream: true`` sends the
Responses event stream while the reply is sampled (:class:`ResponsesStream`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rllm_core.gateway.protocol import (
    HTTPError,
    TextDeltas,
    ToolChoice,
    _arguments,
    _decode,
    _params,
    _rllm,
    _sse,
    encode,
    refuse_format,
    tool_choice,
)
from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

__all__ = [
    "ResponsesBody",
    "ResponsesStream",
    "decode_responses",
    "response_body",
    "to_responses_parts",
]


class _Part(msgspec.Struct):
    type: str
    text: str | None = None


class _Item(msgspec.Struct, kw_only=True):
    type: str | None = None
    role: str | None = None
    content: str | list[_Part] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    output: str | list[_Part] | None = None
    summary: list[_Part] | None = None
    id: str | None = None


class _Tool(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Text(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None


class ResponsesBody(msgspec.Struct, kw_only=True):
    """The fields of a Responses request the gateway reads; others are ignored."""

    model: str | None = None
    input: str | list[_Item]
    instructions: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    text: _Text | None = None


_decoder = msgspec.json.Decoder(ResponsesBody)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


def decode_responses(body: bytes) -> ResponsesBody:
    """Decode a Responses body; raises :class:`HTTPError` (400) naming the bad field."""
    return _decode(_decoder, body)


def _invalid(message: str, param: str, code: str = "invalid_value") -> HTTPError:
    return HTTPError(400, message, param=param, code=code)


def _text(value: str | list[_Part] | None, where: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    pieces = []
    for n, part in enumerate(value):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise _invalid(
                f"{where}[{n}] is a {part.type!r} part; only text parts (input_text,"
                " output_text) are supported",
                f"{where}[{n}]",
            )
        pieces.append(part.text)
    return "".join(pieces)


class _Assistant:
    """An assistant message being assembled from reasoning, message and call items."""

    def __init__(self) -> None:
        self.content: str | None = None
        self.reasoning: str | None = None
        self.calls: list[ToolCall] = []

    def message(self) -> Message:
        return Message(
            role="assistant",
            content=self.content or "",
            reasoning=self.reasoning,
            tool_calls=tuple(self.calls),
        )


def _messages(body: ResponsesBody) -> tuple[Message, ...]:
    out: list[Message] = []
    if body.instructions:
        out.append(Message(role="system", content=body.instructions))
    items = (
        [_Item(type="message", role="user", content=body.input)]
        if isinstance(body.input, str)
        else body.input
    )
    if not items:
        raise _invalid("input holds no items; send a string or at least one item", "input")
    pending: _Assistant | None = None

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            out.append(pending.message())
            pending = None

    for n, item in enumerate(items):
        where = f"input[{n}]"
        kind = item.type or ("message" if item.role else None)
        if kind == "message":
            role = _ROLES.get(item.role or "")
            if role is None:
                raise _invalid(
                    f"{where}.role is {item.role!r}; use system, developer, user or assistant",
                    f"{where}.role",
                )
            text = _text(item.content, f"{where}.content")
            if role == "assistant":
                if pending is None or pending.content is not None or pending.calls:
                    flush()
                    pending = _Assistant()
                pending.content = text
                continue
            flush()
            out.append(Message(role=role, content=text))  # type: ignore[arg-type]
        elif kind == "reasoning":
            flush()
            pending = _Assistant()
            parts = item.content if item.content else item.summary
            pending.reasoning = _text(parts, f"{where}.content")
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise _invalid(
                    f"{where} is a function_call without call_id or name; send both",
                    f"{where}.call_id" if not item.call_id else f"{where}.name",
                )
            if pending is None:
                pending = _Assistant()
            pending.calls.append(
                ToolCall(
                    id=item.call_id,
                    name=item.name,
                    arguments=_arguments("" if item.arguments is None else item.arguments),
                )
            )
        elif kind == "function_call_output":
            if not item.call_id:
                raise _invalid(
                    f"{where} is a function_call_output without call_id; name the call it answers",
                    f"{where}.call_id",
                )
            flush()
            out.append(
                Message(
                    role="tool",
                    content=_text(item.output, f"{where}.output"),
                    tool_call_id=item.call_id,
                )
            )
        else:
            raise _invalid(
                f"{where}.type is {item.type!r}; use message, function_call,"
                " function_call_output or reasoning",
                f"{where}.type",
            )
    flush()
    return tuple(out)


def _tools(raw: list[_Tool] | None) -> tuple[ToolSpec, ...]:
    out = []
    for n, tool in enumerate(raw or ()):
        if tool.type != "function":
            raise _invalid(
                f"tools[{n}].type is {tool.type!r}; only 'function' tools are supported"
                " (the gateway runs no built-in tools)",
                f"tools[{n}].type",
            )
        if not tool.name:
            raise _invalid(f"tools[{n}] has no name", f"tools[{n}].name")
        out.append(
            ToolSpec(
                name=tool.name,
                description=tool.description or "",
                parameters=tool.parameters or {},
            )
        )
    return tuple(out)


def to_responses_parts(
    body: ResponsesBody, defaults: SamplingParams
) -> tuple[tuple[Message, ...], tuple[ToolSpec, ...], ToolChoice, SamplingParams]:
    """Validate a decoded Responses body: the messages, the tools to render, the tool choice
    and the sampling parameters, as :func:`~rllm_core.gateway.protocol.to_chat_parts` returns
    them for the equivalent chat request."""
    if body.previous_response_id is not None:
        raise _invalid(
            f"previous_response_id {body.previous_response_id!r} is not supported: the gateway"
            " keeps no response objects; send the whole conversation as input items (the"
            " previous output items included)",
            "previous_response_id",
            code="unsupported_value",
        )
    if body.text is not None:
        refuse_format(body.text.format, "text.format")
    tools = _tools(body.tools)
    choice = tool_choice(body.tool_choice, tools, nested=False)
    params = _params(
        defaults,
        max_tokens=body.max_output_tokens,
        max_tokens_field="max_output_tokens",
        temperature=body.temperature,
        top_p=body.top_p,
        seed=None,
        n=None,
        stop=None,
    )
    return _messages(body), (() if choice.mode == "none" else tools), choice, params


def _choice_echo(choice: ToolChoice) -> Any:
    if choice.mode == "function":
        return {"type": "function", "name": choice.name}
    return choice.mode


def _output(result: Any) -> list[dict[str, Any]]:
    message = result.message
    short = result.trace_id[:24]
    items: list[dict[str, Any]] = []
    if message.reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{short}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message.reasoning}],
                "status": "completed",
            }
        )
    if message.content or not message.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{short}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": message.content,
                        "annotations": [],
                        "logprobs": [],
                    }
                ],
            }
        )
    for n, call in enumerate(message.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{short}_{n}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _response(
    result: Any | None,
    *,
    response_id: str,
    created: int,
    model: str,
    body: ResponsesBody,
    choice: ToolChoice,
    tools: tuple[ToolSpec, ...],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": _choice_echo(choice),
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in tools
        ],
        "text": {"format": {"type": "text"}},
        "usage": None,
    }
    if result is None:
        return out
    length = result.finish_reason == "length"
    prompt, completion = len(result.prompt_token_ids), len(result.completion_token_ids)
    out.update(
        status="incomplete" if length else "completed",
        incomplete_details={"reason": "max_output_tokens"} if length else None,
        output=_output(result),
        usage={
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        rllm=_rllm(result),
    )
    return out


def response_body(
    result: Any,
    *,
    model: str,
    body: ResponsesBody,
    choice: ToolChoice,
    tools: tuple[ToolSpec, ...],
) -> bytes:
    """A ``response`` object for an engine ``ChatResult``."""
    return encode(
        _response(
            result,
            response_id=f"resp_{result.trace_id}",
            created=int(time.time()),
            model=model,
            body=body,
            choice=choice,
            tools=tools,
        )
    )


_KINDS = {"reasoning": "reasoning", "content": "message"}
_TEXT_EVENT = {"reasoning": "response.reasoning_text", "message": "response.output_text"}


class ResponsesStream:
    """Encodes one streamed response as Responses events while it is sampled.

    ``response.created`` and ``response.in_progress`` go out with the first tokens. Text the
    renderer's parse can no longer change (see :class:`~rllm_core.gateway.protocol.TextDeltas`)
    goes out as it comes: a ``reasoning`` item with ``response.reasoning_text.delta`` events,
    then a ``message`` item with ``response.output_text.delta`` events, each item opened
    (``response.output_item.added``, ``response.content_part.added``) before its first delta
    and closed (``...done`` events) when the next begins. :meth:`finish` closes the open item,
    adds what did not stream (each ``function_call`` item, with its arguments) and sends
    ``response.completed`` (or ``response.incomplete``) with the whole response; its
    ``output`` lists the items in the order they were sent.
    """

    def __init__(
        self,
        *,
        trace_id: str,
        model: str,
        body: ResponsesBody,
        choice: ToolChoice,
        tools: tuple[ToolSpec, ...],
        parse: Callable[[Sequence[int]], Any],
    ) -> None:
        self.trace_id = trace_id
        self.options: dict[str, Any] = {
            "response_id": f"resp_{trace_id}",
            "created": int(time.time()),
            "model": model,
            "body": body,
            "choice": choice,
            "tools": tools,
        }
        self.text = TextDeltas(parse)
        self.number = 0
        self.started = False
        self.sent: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None

    def _event(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self.number
        self.number += 1
        return b"event: " + event["type"].encode() + b"\n" + _sse(event)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        pending = _response(None, **self.options)
        return [
            self._event({"type": "response.created", "response": pending}),
            self._event({"type": "response.in_progress", "response": pending}),
        ]

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.sent.index(item), "content_index": 0}

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        self.sent.append(item)
        self.open = item
        part_type = "output_text" if item["type"] == "message" else "reasoning_text"
        part: dict[str, Any] = {"type": part_type, "text": ""}
        if part_type == "output_text":
            part.update(annotations=[], logprobs=[])
        return [
            self._event(
                {
                    "type": "response.output_item.added",
                    "output_index": len(self.sent) - 1,
                    "item": _pending(item),
                }
            ),
            self._event({"type": "response.content_part.added", **self._where(item), "part": part}),
        ]

    def _close(self, item: dict[str, Any]) -> list[bytes]:
        self.open = None
        [part] = item["content"]
        where = self._where(item)
        prefix = _TEXT_EVENT[item["type"]]
        text_done: dict[str, Any] = {"type": f"{prefix}.done", **where, "text": part["text"]}
        if item["type"] == "message":
            text_done["logprobs"] = []
        return [
            self._event(text_done),
            self._event({"type": "response.content_part.done", **where, "part": part}),
            self._event(
                {
                    "type": "response.output_item.done",
                    "output_index": where["output_index"],
                    "item": item,
                }
            ),
        ]

    def _skeleton(self, kind: str) -> dict[str, Any]:
        short = self.trace_id[:24]
        if kind == "reasoning":
            return {
                "type": "reasoning",
                "id": f"rs_{short}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
                "status": "completed",
            }
        return {
            "type": "message",
            "id": f"msg_{short}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}],
        }

    def _deltas(self, deltas: dict[str, str]) -> list[bytes]:
        parts: list[bytes] = []
        for field in ("reasoning", "content"):
            if field not in deltas:
                continue
            kind = _KINDS[field]
            if self.open is None or self.open["type"] != kind:
                if self.open is not None:
                    parts += self._close(self.open)
                if any(item["type"] == kind for item in self.sent):
                    continue  # text a parser moved back into a closed item: not resent
                parts += self._open(self._skeleton(kind))
            item = self.open
            assert item is not None
            item["content"][0]["text"] += deltas[field]
            parts.append(
                self._event(
                    {
                        "type": f"{_TEXT_EVENT[kind]}.delta",
                        **self._where(item),
                        "delta": deltas[field],
                        **({"logprobs": []} if kind == "message" else {}),
                    }
                )
            )
        return parts

    def piece(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> bytes:
        """The events for tokens just sampled (possibly none)."""
        return b"".join(self._start() + self._deltas(self.text.feed(token_ids)))

    def finish(self, result: Any) -> bytes:
        """The closing events for the engine's result."""
        parts = self._start() + self._deltas(self.text.finish(result.message))
        final = _response(result, **self.options)
        by_id = {item["id"]: item for item in final["output"]}
        if self.open is not None:
            self.open["content"] = by_id[self.open["id"]]["content"]
            parts += self._close(self.open)
        for item in self.sent:
            item.update(by_id.pop(item["id"], {}))
        for item in final["output"]:
            if item["id"] not in by_id:
                continue
            self.sent.append(item)
            index = len(self.sent) - 1
            parts.append(
                self._event(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": _pending(item),
                    }
                )
            )
            if item["type"] in ("message", "reasoning"):
                [part] = item["content"]
                where = self._where(item)
                kind = item["type"]
                empty = {**part, "text": ""}
                parts.append(
                    self._event({"type": "response.content_part.added", **where, "part": empty})
                )
                parts.append(
                    self._event(
                        {
                            "type": f"{_TEXT_EVENT[kind]}.delta",
                            **where,
                            "delta": part["text"],
                            **({"logprobs": []} if kind == "message" else {}),
                        }
                    )
                )
                self.open = item
                parts += self._close(item)
            else:
                where = {"item_id": item["id"], "output_index": index}
                parts += [
                    self._event(
                        {
                            "type": "response.function_call_arguments.delta",
                            **where,
                            "delta": item["arguments"],
                        }
                    ),
                    self._event(
                        {
                            "type": "response.function_call_arguments.done",
                            **where,
                            "name": item["name"],
                            "arguments": item["arguments"],
                        }
                    ),
                    self._event(
                        {"type": "response.output_item.done", "output_index": index, "item": item}
                    ),
                ]
        final["output"] = self.sent
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        parts.append(self._event({"type": done, "response": final}))
        return b"".join(parts)


def _pending(item: dict[str, Any]) -> dict[str, Any]:
    pending = {**item, "status": "in_progress"}
    if item["type"] == "message":
        pending["content"] = []
    elif item["type"] == "function_call":
        pending["arguments"] = ""
    return pending
