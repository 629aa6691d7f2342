"""The OpenAI wire format: request bodies in, response bodies and errors out.

Requests are decoded with msgspec into typed structs, so a known field of the wrong type is a
400 that names the field; unknown fields (``user``, ``metadata``...) are ignored. What the
gateway cannot honour is refused rather than silently dropped: ``n`` other than 1,
``response_format`` other than ``{"type": "text"}`` (sampling is never constrained), stop
strings, ``top_logprobs`` above 0, ``echo``, and content parts other than text.

``tool_choice: "none"`` renders the conversation without the tools, so the model is not offered
any. ``"required"`` and a named function render the tools as ``"auto"`` does and sample once;
the reply is returned as sampled and ``rllm.tool_choice_met`` says whether it holds a (matching)
tool call. ``logprobs: true`` returns each sampled token's logprob (no alternatives). The
vLLM extension ``return_token_ids: true`` adds ``prompt_token_ids`` and ``token_ids`` to the
choice.

Every response also carries a non-standard ``rllm`` object (trace id, lineage, turn, mode, reset
reason and, for a history break, the first divergent message and ``history_break`` (its
reason, ``at``, ``kept``, ``dropped``, ``inserted`` and ``source``), weight version, the
malformed tool-call attempts the reply dropped, and ``tool_choice_met``); OpenAI clients ignore it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rllm_core.ports.rendering import (
    ArgumentsDelta,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStart,
    ToolCallStream,
)
from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

__all__ = [
    "ChatCompletionBody",
    "CompletionBody",
    "HTTPError",
    "ChatStream",
    "StreamedText",
    "ToolChoice",
    "chat_completion",
    "completion_chunks",
    "completion_response",
    "decode_chat",
    "decode_completion",
    "encode",
    "error_body",
    "refuse_format",
    "to_chat_parts",
    "to_completion_parts",
    "tool_choice",
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
    response_format: dict[str, Any] | None = None
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
_LONE_SURROGATE = re.compile(rb'\\u[dD][89abAB][0-9a-fA-F]{2}"')


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
        detail = str(exc)
        lone = _LONE_SURROGATE.search(body) if detail == "Input data was truncated" else None
        if lone is not None:
            # msgspec reports a high surrogate escape that ends its string as truncated input.
            detail = (
                f"{lone.group(0)[:-1].decode()} at byte {lone.start()} is half of a UTF-16"
                " surrogate pair, not a character; send the character itself in UTF-8"
            )
        raise HTTPError(
            400, f"the request body is not valid JSON: {detail}", code="invalid_json"
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


MAX_TOKEN_ID = 2**31 - 1
"""The largest token id a request may hold (model servers keep ids as 32-bit integers)."""


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


def refuse_format(value: dict[str, Any] | None, param: str) -> None:
    """Refuse a structured-output request: the gateway cannot constrain sampling."""
    if value is None or value.get("type") == "text":
        return
    kind = value.get("type")
    raise _invalid(
        f"{param} {{'type': {kind!r}}} is not supported: the gateway samples the policy's tokens"
        " without constrained decoding, so it cannot guarantee JSON; remove"
        f" {param} (or send {{'type': 'text'}}) and ask for JSON in the prompt",
        param,
        code="unsupported_value",
    )


class ToolChoice(msgspec.Struct, frozen=True):
    """A validated ``tool_choice``: ``mode`` is ``auto``, ``none``, ``required`` or
    ``function`` (then ``name`` is the function the reply must call)."""

    mode: str = "auto"
    name: str | None = None


def tool_choice(
    choice: str | dict[str, Any] | None, tools: Sequence[ToolSpec], *, nested: bool = True
) -> ToolChoice:
    """Validate ``tool_choice`` against the offered ``tools``. ``nested`` is the chat shape
    ``{"type": "function", "function": {"name": X}}``; otherwise the Responses shape
    ``{"type": "function", "name": X}``."""
    if choice is None or choice == "auto":
        return ToolChoice()
    if choice in ("none", "required"):
        if choice == "required" and not tools:
            raise _invalid(
                "tool_choice is 'required' but the request offers no tools; add tools or use"
                " tool_choice 'auto'",
                "tool_choice",
            )
        return ToolChoice(str(choice))
    shape = (
        "{'type': 'function', 'function': {'name': ...}}"
        if nested
        else "{'type': 'function', 'name': ...}"
    )
    if isinstance(choice, str):
        raise _invalid(
            f"tool_choice {choice!r} is unknown; use 'auto', 'none', 'required' or {shape}",
            "tool_choice",
        )
    target = choice.get("function") if nested else choice
    name = target.get("name") if isinstance(target, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _invalid(
            f"tool_choice {encode(choice).decode()} is not a function choice; use {shape}",
            "tool_choice",
        )
    offered = [t.name for t in tools]
    if name not in offered:
        param = "tool_choice.function.name" if nested else "tool_choice.name"
        listed = ", ".join(repr(n) for n in offered) or "none"
        raise _invalid(
            f"tool_choice names the function {name!r}, which is not in tools (offered:"
            f" {listed}); add it to tools or name one of them",
            param,
        )
    return ToolChoice("function", name)


def _tools(raw: list[_Tool] | None) -> tuple[ToolSpec, ...]:
    if not raw:
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
) -> tuple[tuple[Message, ...], tuple[ToolSpec, ...], ToolChoice, SamplingParams]:
    """Validate a decoded chat body: its messages, the tools to render, the tool choice and
    the sampling parameters. ``tool_choice: "none"`` renders no tools."""
    refuse_format(body.response_format, "response_format")
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
    tools = _tools(body.tools)
    choice = tool_choice(body.tool_choice, tools)
    messages = _messages(body.messages)
    return messages, (() if choice.mode == "none" else tools), choice, params


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
        isinstance(t, int) and not isinstance(t, bool) for t in raw
    )
    if isinstance(raw, str) or token_ids:
        prompt = raw
    else:
        raise _invalid(
            "prompt must be a string or a list of token ids (one prompt per request)", "prompt"
        )
    if token_ids:
        bad = next((t for t in raw if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise _invalid(
                f"prompt token id {bad} is outside 0..{MAX_TOKEN_ID}; send ids from the model's"
                " vocabulary",
                "prompt",
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
        rewrite = getattr(result, "history_break", None)
        if rewrite is not None:
            info["history_break"] = msgspec.to_builtins(rewrite)
        dropped = [
            {"status": a.status, "raw": a.raw, "error": a.error}
            for a in result.tool_call_attempts
            if a.status != "ok"
        ]
        if dropped:
            info["malformed_tool_calls"] = dropped
        met = getattr(result, "tool_choice_met", None)
        if met is not None:
            info["tool_choice_met"] = met
    return info


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chat_logprobs(result: Any, decode: Decode) -> dict[str, Any]:
    return _token_logprobs(result.completion_token_ids, result.logprobs, decode)


def _token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[float], decode: Decode
) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(token_ids, logprobs, strict=True):
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


def _stable(text: str) -> str:
    """The part of a partial reply's text that more tokens cannot change: without an
    unfinished character, a tag that may still be forming, or trailing whitespace a parser
    may strip once a tag follows."""
    text = text.rstrip("\ufffd")
    opened = text.rfind("<")
    if opened >= 0 and ">" not in text[opened:]:
        text = text[:opened]
    return text.rstrip()


PARSE_BUDGET_S = 50e-6
"""CPU a streamed reply may spend re-parsing per sampled token, on average."""

PARSE_SHARE_OF_WAIT = 0.1
"""The share of the time between tokens a streamed reply may spend re-parsing: tokens that
arrive slowly are each parsed, however long the reply."""


class _ParseBudget:
    """When a streamed reply is re-parsed: once the tokens since the last parse have earned
    its cost at :data:`PARSE_BUDGET_S` each, or the wait since it ended is long enough that a
    parse takes at most :data:`PARSE_SHARE_OF_WAIT` of it."""

    def __init__(self) -> None:
        self.pending = 0
        self.cost = 0.0
        self.ended = time.perf_counter()

    def due(self, tokens: int) -> bool:
        self.pending += tokens
        if self.pending * PARSE_BUDGET_S >= self.cost:
            return True
        return (time.perf_counter() - self.ended) * PARSE_SHARE_OF_WAIT >= self.cost

    def run(self, parse: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = parse()
        self.ended = time.perf_counter()
        self.cost = self.ended - started
        self.pending = 0
        return result


class TextDeltas:
    """The ``reasoning`` and ``content`` text of a reply as it is sampled, handed out only
    where more tokens can no longer change it (see :func:`_stable`); a tool-call tag is held
    back until it closes, and once a tool call begins no more content is handed out.

    The partial reply is parsed whole, so a parse costs more as the reply grows; a new parse
    waits until the tokens since the last one have earned its cost at
    :data:`PARSE_BUDGET_S` each, unless they came slowly (:data:`PARSE_SHARE_OF_WAIT`). A
    short reply is parsed at every token, a long one sampled fast every few dozen."""

    def __init__(self, parse: Callable[[Sequence[int]], Any]) -> None:
        self.parse = parse
        self.ids: list[int] = []
        self.sent = {"reasoning": "", "content": ""}
        self._budget = _ParseBudget()

    def _deltas(self, texts: dict[str, str], final: bool) -> dict[str, str]:
        out = {}
        for field, text in texts.items():
            stable = text if final else _stable(text)
            sent = self.sent[field]
            if len(stable) > len(sent) and stable.startswith(sent):
                out[field] = stable[len(sent) :]
                self.sent[field] = stable
        return out

    def feed(self, token_ids: Sequence[int]) -> dict[str, str]:
        """The new text once ``token_ids`` were sampled, by field."""
        self.ids.extend(token_ids)
        if not self._budget.due(len(token_ids)):
            return {}
        parsed = self._budget.run(lambda: self.parse(self.ids))
        texts = {"reasoning": parsed.reasoning or ""}
        if not parsed.tool_calls:
            texts["content"] = parsed.content
        return self._deltas(texts, final=False)

    def finish(self, message: Message) -> dict[str, str]:
        """What is left of the finished reply's text, where it extends what was handed out."""
        return self._deltas(
            {"reasoning": message.reasoning or "", "content": message.content}, final=True
        )


class StreamedText:
    """Feeds a renderer's :class:`~rllm_core.ports.rendering.ToolCallStream` the decoded text
    of a reply as it is sampled: the text before the first stop token, without a character
    still being decoded. The partial reply is decoded whole (a tokenizer may decode a token
    differently once the next one is known), so, as :class:`TextDeltas` parses, a new decode
    waits on the same budget."""

    def __init__(
        self,
        stream: ToolCallStream,
        decode: Callable[[Sequence[int]], str],
        stops: Sequence[int],
    ) -> None:
        self.stream = stream
        self.decode = decode
        self.stops = frozenset(stops)
        self.ids: list[int] = []
        self.fed = ""
        self.stopped = False
        self._budget = _ParseBudget()

    def _text(self) -> str:
        return self._budget.run(lambda: self.decode(self.ids))

    def _feed(self, text: str) -> list[StreamEvent]:
        if not text.startswith(self.fed):
            # The decode of earlier tokens changed: what was read stands, finish() reads on.
            return []
        new, self.fed = text[len(self.fed) :], text
        return self.stream.feed(new) if new else []

    def feed(self, token_ids: Sequence[int]) -> list[StreamEvent]:
        """The events once ``token_ids`` were sampled."""
        if self.stopped:
            return []
        for token in token_ids:
            if token in self.stops:
                self.stopped = True
                break
            self.ids.append(token)
        if not self._budget.due(len(token_ids)) and not self.stopped:
            return []
        return self._feed(self._text().rstrip("\ufffd"))

    def finish(self) -> list[StreamEvent]:
        """The events of the rest of the reply, once it is complete."""
        return self._feed(self._text()) + self.stream.finish()


_CHAT_FIELDS = {"reasoning": "reasoning_content", "content": "content"}


class ChatStream:
    """Encodes one streamed chat completion as SSE ``chat.completion.chunk`` events while it
    is sampled.

    :meth:`piece` takes the tokens sampled since the last call: the partial completion is
    parsed with ``parse`` (the renderer's ``parse_response`` with the request's tools) and the
    text that can no longer change goes out as ``reasoning_content`` and ``content`` deltas; a
    tool-call tag is held back until it closes. With ``tool_calls`` (for a renderer that
    :class:`~rllm_core.ports.rendering.StreamsToolCalls`) the renderer's stream reads the reply
    instead, and each tool call goes out as vLLM streams one: its index, id, type and name
    first, then its arguments as they arrive; calls it did not start go out whole at the end.
    :meth:`finish` sends what is left of the parsed reply, the tool
    calls (each whole, with its index), the finish reason, usage when asked, and ``[DONE]``.
    The deltas concatenate to the non-streamed reply, except text a parser moves (for
    example text after a tool call, or reasoning and content split differently once the reply
    is complete): that part is then not sent.
    """

    def __init__(
        self,
        *,
        trace_id: str,
        model: str,
        parse: Callable[[Sequence[int]], Any],
        decode: Decode,
        logprobs: bool,
        include_usage: bool,
        token_ids: bool,
        tool_calls: StreamedText | None = None,
    ) -> None:
        self.id = f"chatcmpl-{trace_id}"
        self.call_id_prefix = f"call_{trace_id[:12]}_"
        self.calls = tool_calls
        self.started_calls = 0
        self.created = int(time.time())
        self.model = model
        self.decode = decode
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.token_ids = token_ids
        self.text = TextDeltas(parse)
        self.started = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        choice.update(extra)
        return _sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
            }
        )

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _deltas(self, events: Sequence[StreamEvent]) -> list[dict[str, Any]]:
        """Chunk deltas for a tool-call stream's events, as vLLM streams them: a call's id,
        type and function name first (its arguments ``""``), then its arguments as they
        arrive. Ids are the ones the finished reply gives its calls."""
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ContentDelta):
                self.text.sent["content"] += event.text
                out.append({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                self.text.sent["reasoning"] += event.text
                out.append({"reasoning_content": event.text})
            elif isinstance(event, ToolCallStart):
                self.started_calls = event.index + 1
                call = {
                    "index": event.index,
                    "id": f"{self.call_id_prefix}{event.index}",
                    "type": "function",
                    "function": {"name": event.name, "arguments": ""},
                }
                out.append({"tool_calls": [call]})
            elif isinstance(event, ArgumentsDelta) and event.text:
                call = {"index": event.index, "function": {"arguments": event.text}}
                out.append({"tool_calls": [call]})
        return out

    def piece(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> bytes:
        """The events for tokens just sampled (possibly none)."""
        parts = self._start()
        if self.calls is not None:
            deltas = self._deltas(self.calls.feed(token_ids))
        else:
            deltas = [{_CHAT_FIELDS[f]: t} for f, t in self.text.feed(token_ids).items()]
        extra = {}
        if self.logprobs:
            extra["logprobs"] = _token_logprobs(token_ids, logprobs, self.decode)
        for delta in deltas:
            parts.append(self._chunk(delta, **extra))
            extra = {}
        if extra:
            parts.append(self._chunk({}, **extra))
        return b"".join(parts)

    def finish(self, result: Any) -> bytes:
        """The closing events for the engine's result."""
        parts = self._start()
        message = result.message
        if self.calls is not None:
            parts += [self._chunk(delta) for delta in self._deltas(self.calls.finish())]
        for field, text in self.text.finish(message).items():
            parts.append(self._chunk({_CHAT_FIELDS[field]: text}))
        # Calls the stream did not start (all of them without a tool-call stream) go out whole.
        if len(message.tool_calls) > self.started_calls:
            calls = [
                {
                    "index": n,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for n, c in enumerate(message.tool_calls)
                if n >= self.started_calls
            ]
            parts.append(self._chunk({"tool_calls": calls}))
        last_extra = {"token_ids": result.completion_token_ids} if self.token_ids else {}
        parts.append(self._chunk({}, result.finish_reason, **last_extra))
        tail: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "rllm": _rllm(result),
        }
        if self.token_ids:
            tail["prompt_token_ids"] = result.prompt_token_ids
        if self.include_usage:
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
