"""The OpenAI wire format: request bodies in, response bodies and errors out.

Requests are decoded with msgspec into typed structs, so a known field of the wrong type is a
400 that names the field; unknown fields (``user``, ``metadata``, ``response_format``...) are
ignored. What the gateway cannot honour is refused rather than silently dropped: ``n`` other than
1, ``tool_choice`` other than ``"auto"`` / ``"none"``, stop strings, ``top_logprobs`` above 0,
``echo``, and content parts other than text.

``tool_choice: "none"`` renders the conversation without the tools, so the model is not offered
any. ``logprobs: true`` returns each sampled token's logprob (no alternatives). The
vLLM extension ``return_token_ids: true`` adds ``prompt_token_ids`` and ``token_ids`` to the
choice.

Every response also carries a non-standard ``rllm`` object (trace id, lineage, turn, mode, reset
reason and, for ``prefix_changed``, the first divergent message, weight version, and the
malformed tool-call attempts the reply dropped); OpenAI clients ignore it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

__all__ = [
    "ChatCompletionBody",
    "CompletionBody",
    "HTTPError",
    "chat_chunks",
    "chat_completion",
    "completion_chunks",
    "completion_response",
    "decode_chat",
    "decode_completion",
    "encode",
    "error_body",
    "to_chat_parts",
    "to_completion_parts",
]

encode = msgspec.json.Encoder().encode


class HTTPError(Exception):
    """An error response in the OpenAI shape ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = list(headers)

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> bytes:
    return encode({"error": {"message": message, "type": type, "param": param, "code": code}})


# ------------------------------------------------------------------------------ request bodies


class _ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class _FunctionCall(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] = ""


class _ToolCall(msgspec.Struct):
    function: _FunctionCall
    id: str = ""
    type: str = "function"


class _Message(msgspec.Struct):
    role: str
    content: str | list[_ContentPart] | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(msgspec.Struct):
    function: _FunctionDef
    type: str = "function"


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _RequestBody(msgspec.Struct, kw_only=True):
    """Fields both completion endpoints read."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    return_token_ids: bool | None = None


class ChatCompletionBody(_RequestBody, kw_only=True):
    """The fields of a chat completion request the gateway reads."""

    messages: list[_Message]
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionBody(_RequestBody, kw_only=True):
    """The fields of a (legacy) completion request the gateway reads."""

    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool | None = None


_chat_decoder = msgspec.json.Decoder(ChatCompletionBody)
_completion_decoder = msgspec.json.Decoder(CompletionBody)
_LOCATION = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _LOCATION.search(text)
        param = (match.group("path") or None) if match else None
        detail = text[: match.start()] if match else text
        if detail.startswith("Object missing required field"):
            field = detail.split("`")[1]
            param = f"{param}.{field}" if param else field
            raise HTTPError(
                400, f"missing required field '{param}'", param=param, code="missing_field"
            ) from None
        where = f"field '{param}'" if param else "the request body"
        raise HTTPError(
            400,
            f"{where}: {detail[0].lower()}{detail[1:]}",
            param=param,
            code="invalid_type",
        ) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(
            400, f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None


def decode_chat(body: bytes) -> ChatCompletionBody:
    """Decode a chat completion body; raises :class:`HTTPError` (400) naming the bad field."""
    return _decode(_chat_decoder, body)


def decode_completion(body: bytes) -> CompletionBody:
    """Decode a completion body; raises :class:`HTTPError` (400) naming the bad field."""
    return _decode(_completion_decoder, body)


# ------------------------------------------------------------------------------ validation

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_ROLES["tool"] = "tool"


def _invalid(message: str, param: str, code: str = "invalid_value") -> HTTPError:
    return HTTPError(400, message, param=param, code=code)


def _text(content: str | list[_ContentPart] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for n, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise _invalid(
                f"{where}.content[{n}] is a {part.type!r} part; only text parts"
                " ({'type': 'text', 'text': ...}) are supported",
                f"{where}.content[{n}]",
            )
        pieces.append(part.text)
    return "".join(pieces)


def _arguments(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else encode(value).decode()


def _messages(raw: list[_Message]) -> tuple[Message, ...]:
    if not raw:
        raise _invalid("messages must hold at least one message", "messages")
    out = []
    for n, m in enumerate(raw):
        role = _ROLES.get(m.role)
        if role is None:
            raise _invalid(
                f"messages[{n}].role is {m.role!r}; use system, developer, user, assistant or tool",
                f"messages[{n}].role",
            )
        calls: tuple[ToolCall, ...] = ()
        if m.tool_calls:
            if role != "assistant":
                raise _invalid(
                    f"messages[{n}] has tool_calls but role {m.role!r}; only assistant messages"
                    " carry tool calls",
                    f"messages[{n}].tool_calls",
                )
            calls = tuple(
                ToolCall(id=c.id, name=c.function.name, arguments=_arguments(c.function.arguments))
                for c in m.tool_calls
            )
        content = m.content
        if not isinstance(content, str):
            content = _text(content, f"messages[{n}]")
        reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        out.append(
            Message(
                role=role,  # type: ignore[arg-type]
                content=content,
                reasoning=reasoning if role == "assistant" else None,
                tool_calls=calls,
                tool_call_id=m.tool_call_id if role == "tool" else None,
                name=m.name,
            )
        )
    return tuple(out)


def _tools(raw: list[_Tool] | None, choice: str | dict[str, Any] | None) -> tuple[ToolSpec, ...]:
    if choice is not None and choice not in ("auto", "none"):
        shown = choice if isinstance(choice, str) else "an object"
        raise _invalid(
            f"tool_choice {shown!r} is not supported; use 'auto' or 'none'", "tool_choice"
        )
    if not raw or choice == "none":
        return ()
    out = []
    for n, tool in enumerate(raw):
        if tool.type != "function":
            raise _invalid(
                f"tools[{n}].type is {tool.type!r}; only 'function' tools are supported",
                f"tools[{n}].type",
            )
        f = tool.function
        out.append(
            ToolSpec(name=f.name, description=f.description or "", parameters=f.parameters or {})
        )
    return tuple(out)


def _params(
    defaults: SamplingParams,
    *,
    max_tokens: int | None,
    max_tokens_field: str,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    n: int | None,
    stop: str | list[str] | None,
) -> SamplingParams:
    if n is not None and n != 1:
        raise _invalid(f"n is {n}; the gateway samples one choice per request (n=1)", "n")
    if stop:
        raise _invalid(
            "stop sequences are not supported: a turn ends at the renderer's stop tokens;"
            " remove 'stop'",
            "stop",
        )
    if max_tokens is not None and max_tokens < 1:
        raise _invalid(
            f"{max_tokens_field} is {max_tokens}; it must be at least 1", max_tokens_field
        )
    if temperature is not None and temperature < 0:
        raise _invalid(f"temperature is {temperature}; it must be >= 0", "temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise _invalid(f"top_p is {top_p}; it must be in (0, 1]", "top_p")
    if max_tokens is None and temperature is None and top_p is None and seed is None:
        return defaults
    return SamplingParams(
        max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        stop_token_ids=defaults.stop_token_ids,
        seed=defaults.seed if seed is None else seed,
    )


def to_chat_parts(
    body: ChatCompletionBody, defaults: SamplingParams
) -> tuple[tuple[Message, ...], tuple[ToolSpec, ...], SamplingParams]:
    """Validate a decoded chat body: its messages, tools and sampling parameters."""
    if body.top_logprobs:
        raise _invalid(
            "top_logprobs is not supported: the sampler reports only the sampled token's"
            " logprob; use logprobs=true without top_logprobs",
            "top_logprobs",
        )
    use_completion_field = body.max_completion_tokens is not None
    params = _params(
        defaults,
        max_tokens=body.max_completion_tokens if use_completion_field else body.max_tokens,
        max_tokens_field="max_completion_tokens" if use_completion_field else "max_tokens",
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        n=body.n,
        stop=body.stop,
    )
    return _messages(body.messages), _tools(body.tools, body.tool_choice), params


def to_completion_parts(
    body: CompletionBody, defaults: SamplingParams
) -> tuple[str | list[int], SamplingParams]:
    """Validate a decoded completion body: its prompt (text or token ids) and parameters."""
    if body.echo:
        raise _invalid("echo is not supported; remove it", "echo")
    if body.logprobs:
        raise _invalid(
            f"logprobs={body.logprobs} asks for alternatives, which the sampler does not"
            " report; use logprobs=0 for the sampled tokens' logprobs",
            "logprobs",
        )
    prompt: str | list[int]
    raw = body.prompt
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]
    token_ids = not isinstance(raw, str) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw
    )
    if isinstance(raw, str) or token_ids:
        prompt = raw
    else:
        raise _invalid(
            "prompt must be a string or a list of token ids (one prompt per request)", "prompt"
        )
    params = _params(
        defaults,
        max_tokens=body.max_tokens,
        max_tokens_field="max_tokens",
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        n=body.n,
        stop=body.stop,
    )
    return prompt, params


# ------------------------------------------------------------------------------ responses

Decode = Callable[[Sequence[int]], str]


def _rllm(result: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "trace_id": result.trace_id,
        "lineage_id": result.lineage_id,
        "turn": result.turn,
        "weight_version": result.weight_version,
    }
    mode = getattr(result, "mode", None)
    if mode is not None:
        info["mode"] = mode
        info["reset_reason"] = result.reset_reason
        divergent = getattr(result, "divergent_message", None)
        if divergent is not None:
            info["divergent_message"] = divergent
        dropped = [
            {"status": a.status, "raw": a.raw, "error": a.error}
            for a in result.tool_call_attempts
            if a.status != "ok"
        ]
        if dropped:
            info["malformed_tool_calls"] = dropped
    return info


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chat_logprobs(result: Any, decode: Decode) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
        text = decode([token_id])
        content.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return {"content": content, "refusal": None}


def _assistant(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": "assistant",
        "content": message.content if (message.content or not message.tool_calls) else None,
    }
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in message.tool_calls
        ]
    return out


def chat_completion(
    result: Any, *, model: str, logprobs: bool, decode: Decode, token_ids: bool = False
) -> bytes:
    """A ``chat.completion`` body for an engine ``ChatResult``."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": _assistant(result.message),
        "logprobs": _chat_logprobs(result, decode) if logprobs else None,
        "finish_reason": result.finish_reason,
    }
    if token_ids:
        choice["token_ids"] = result.completion_token_ids
    body: dict[str, Any] = {
        "id": f"chatcmpl-{result.trace_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(len(result.prompt_token_ids), len(result.completion_token_ids)),
        "rllm": _rllm(result),
    }
    if token_ids:
        body["prompt_token_ids"] = result.prompt_token_ids
    return encode(body)


def _sse(payload: Any) -> bytes:
    return b"data: " + encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def chat_chunks(
    result: Any,
    *,
    model: str,
    logprobs: bool,
    decode: Decode,
    include_usage: bool,
    token_ids: bool = False,
) -> bytes:
    """The whole SSE stream (``chat.completion.chunk`` events, then ``[DONE]``) for a result."""
    created = int(time.time())
    cid = f"chatcmpl-{result.trace_id}"

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        choice.update(extra)
        return _sse(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
        )

    message = result.message
    parts = [chunk({"role": "assistant", "content": ""})]
    if message.reasoning:
        parts.append(chunk({"reasoning_content": message.reasoning}))
    if message.content or logprobs:
        extra = {"logprobs": _chat_logprobs(result, decode)} if logprobs else {}
        parts.append(chunk({"content": message.content}, **extra))
    if message.tool_calls:
        calls = [
            {
                "index": n,
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for n, c in enumerate(message.tool_calls)
        ]
        parts.append(chunk({"tool_calls": calls}))
    last_extra = {"token_ids": result.completion_token_ids} if token_ids else {}
    parts.append(chunk({}, result.finish_reason, **last_extra))
    tail: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "rllm": _rllm(result),
    }
    if include_usage:
        tail["usage"] = _usage(len(result.prompt_token_ids), len(result.completion_token_ids))
    parts.append(_sse(tail))
    parts.append(SSE_DONE)
    return b"".join(parts)


def _completion_logprobs(result: Any, decode: Decode) -> dict[str, Any]:
    tokens = [decode([t]) for t in result.completion_token_ids]
    offsets = []
    at = 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": result.logprobs,
        "top_logprobs": None,
        "text_offset": offsets,
    }


def _completion_choice(result: Any, logprobs: bool, decode: Decode, token_ids: bool) -> dict:
    choice: dict[str, Any] = {
        "index": 0,
        "text": result.text,
        "logprobs": _completion_logprobs(result, decode) if logprobs else None,
        "finish_reason": result.finish_reason,
    }
    if token_ids:
        choice["prompt_token_ids"] = result.prompt_token_ids
        choice["token_ids"] = result.completion_token_ids
    return choice


def completion_response(
    result: Any, *, model: str, logprobs: bool, decode: Decode, token_ids: bool = False
) -> bytes:
    """A ``text_completion`` body for an engine ``CompletionResult``."""
    return encode(
        {
            "id": f"cmpl-{result.trace_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [_completion_choice(result, logprobs, decode, token_ids)],
            "usage": _usage(len(result.prompt_token_ids), len(result.completion_token_ids)),
            "rllm": _rllm(result),
        }
    )


def completion_chunks(
    result: Any,
    *,
    model: str,
    logprobs: bool,
    decode: Decode,
    include_usage: bool,
    token_ids: bool = False,
) -> bytes:
    """The SSE stream of a completion: one chunk with the text, then ``[DONE]``."""
    body: dict[str, Any] = {
        "id": f"cmpl-{result.trace_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_completion_choice(result, logprobs, decode, token_ids)],
        "rllm": _rllm(result),
    }
    if include_usage:
        body["usage"] = _usage(len(result.prompt_token_ids), len(result.completion_token_ids))
    return _sse(body) + SSE_DONE
