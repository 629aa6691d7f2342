"""Hostile requests never crash the gateway and never lose data: property-based tests (with
``hypothesis``) of every route, driven in-process through the ASGI app and, for one property,
over real uvicorn.

Every answer must be a 2xx, or a 4xx in the OpenAI error shape; never a 5xx, and never an
error event inside a stream that started with 200. After the fuzzing the gateway still serves,
and the traces of sessions acknowledged before it read back byte for byte the same.

The default run tries a few hundred examples in all. The soak (marker ``slow``) runs the same
properties with ``RLLM_SOAK_REPEATS`` times the examples (2 unless set, the bounded form the
whole suite runs; ``RLLM_SOAK_REPEATS=20 make test PYTEST_ARGS="-m slow -k fuzz"`` for the
full soak). The number of examples each property tried is printed in pytest's terminal summary
("gateway fuzz examples"), so it shows in every CI log.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.server import Gateway
from rllm_core.gateway.tokens import SessionTokens
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest

SOAK_REPEATS = int(os.environ.get("RLLM_SOAK_REPEATS", "2"))
TOKEN = "admin-token"
MAX_BODY = 64 * 1024
KEPT = ("kept-1", "kept-2")

# ---------------------------------------------------------------------------- strategies

CONTROL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|>assistant\n",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<tool_call>",
    "</tool_call>",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<think>",
    "</think>",
]
ODD_TEXT = [
    "",
    "\x00",
    "\u202e\u202dtxet lmth",
    "\u200b\ufeff",
    "😀👨‍👩‍👧",
    "\ud800",
    "\udfff",
    "\U0010ffff",
    "a\r\nb",
    "\\u0000",
    "%00",
    "x" * 5000,
]
text = st.one_of(
    st.sampled_from(CONTROL + ODD_TEXT),
    st.text(max_size=40),
    st.lists(st.sampled_from(CONTROL + ODD_TEXT) | st.text(max_size=8), max_size=5).map("".join),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
role = st.sampled_from(["user", "system", "assistant", "tool", "developer", "function", ""])
content = st.one_of(
    text,
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", "input_text", ""])},
            optional={"text": text | json_value},
        ),
        max_size=3,
    ),
    json_value,
)
tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": text}, optional={"arguments": text | json_value})},
    optional={"id": text, "type": text},
)
message = st.fixed_dictionaries(
    {"role": role | json_value},
    optional={
        "content": content,
        "name": text,
        "tool_calls": st.lists(tool_call, max_size=2) | json_value,
        "tool_call_id": text,
        "reasoning_content": text,
    },
)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": text},
            optional={"description": text, "parameters": st.dictionaries(text, json_value)},
        ),
    }
)
sampling = {
    "model": text | json_value,
    "max_tokens": st.integers(min_value=-5, max_value=2**40) | json_value,
    "temperature": st.floats() | json_value,
    "top_p": st.floats() | json_value,
    "seed": st.integers(min_value=-(2**70), max_value=2**70),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "n": st.integers(min_value=-2, max_value=4),
    "stop": text | st.lists(text, max_size=3),
    "return_token_ids": st.booleans(),
}
chat_body = st.fixed_dictionaries(
    {"messages": st.lists(message, max_size=4)},
    optional={
        **sampling,
        "tools": st.lists(tool, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required", "x"])
        | st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": text})}
        )
        | json_value,
        "response_format": st.fixed_dictionaries({"type": text}) | json_value,
        "max_completion_tokens": st.integers(min_value=-5, max_value=2**40),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(min_value=-5, max_value=100),
        "extra": json_value,
    },
)
# Well-formed requests with hostile text, so that most reach the renderer and the sampler.
plain_text = st.one_of(
    st.sampled_from(CONTROL + ODD_TEXT),
    st.lists(st.sampled_from(CONTROL + ODD_TEXT) | st.text(max_size=8), max_size=5).map("".join),
)
plain_call = st.fixed_dictionaries(
    {
        "id": plain_text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": plain_text, "arguments": plain_text}),
    }
)
plain_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer"]), "content": plain_text}
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": plain_text | st.none()},
        optional={"tool_calls": st.lists(plain_call, max_size=2)},
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": plain_text, "tool_call_id": plain_text}
    ),
)
plain_chat = st.fixed_dictionaries(
    {"messages": st.lists(plain_message, min_size=1, max_size=5)},
    optional={
        "stream": st.booleans(),
        "max_tokens": st.integers(min_value=1, max_value=64),
        "tools": st.lists(tool, max_size=2),
        "logprobs": st.booleans(),
        "return_token_ids": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    },
)
plain_responses = st.fixed_dictionaries(
    {
        "input": plain_text
        | st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant"]), "content": plain_text}
            ),
            min_size=1,
            max_size=4,
        )
    },
    optional={"instructions": plain_text, "stream": st.booleans()},
)
completion_body = st.fixed_dictionaries(
    {
        "prompt": text
        | st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=6)
        | st.lists(text, max_size=3)
        | json_value
    },
    optional={**sampling, "logprobs": st.integers(-3, 30), "echo": st.booleans()},
)
item = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning"])
        | text,
        "role": role,
        "content": content,
        "call_id": text,
        "name": text,
        "arguments": text | json_value,
        "output": content,
        "summary": st.lists(st.fixed_dictionaries({"type": text, "text": text}), max_size=2),
        "id": text,
    },
)
responses_body = st.fixed_dictionaries(
    {"input": text | st.lists(item, max_size=4) | json_value},
    optional={
        "instructions": text,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "web_search", ""])},
                optional={"name": text, "parameters": st.dictionaries(text, json_value)},
            ),
            max_size=2,
        ),
        "tool_choice": text | json_value,
        "max_output_tokens": st.integers(min_value=-5, max_value=2**40),
        "temperature": st.floats(),
        "stream": st.booleans(),
        "previous_response_id": text,
        "text": st.fixed_dictionaries({}, optional={"format": json_value}),
    },
)


def _json(value: Any, ascii_only: bool) -> bytes:
    # allow_nan gives NaN/Infinity, which are not JSON; surrogatepass turns a lone surrogate
    # into bytes that are not UTF-8: both hostile on purpose.
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _nested(depth: int, opener: bytes, closer: bytes, inner: bytes = b"1") -> bytes:
    return opener * depth + inner + closer * depth


raw_body = st.one_of(
    st.binary(max_size=300),
    st.builds(_json, json_value, st.booleans()),
    st.integers(1, 20_000).map(lambda n: _nested(n, b"[", b"]")),
    st.integers(1, 20_000).map(lambda n: _nested(n, b'{"a":', b"}")),
    st.integers(1, 20_000).map(
        lambda n: b'{"messages":[{"role":"user","content":' + _nested(n, b"[", b"]") + b"}]}"
    ),
    st.integers(MAX_BODY - 100, MAX_BODY + 100).map(
        lambda n: b'{"messages":[{"role":"user","content":"' + b"x" * n + b'"}]}'
    ),
    st.sampled_from(
        [b"", b"null", b"{}", b"[]", b'"', b"\xff\xfe", b'{"messages":[', b"\x00" * 10]
    ),
)

ODD_SESSIONS = [
    "",
    ".",
    "..",
    "../kept-1",
    "..%2Fkept-1",
    "%2e%2e",
    "kept-1%2F..",
    "a/b",
    "%00",
    "a b",
    "s\x00",
    "\u202eevil",
    "😀",
    "x" * 256,
    "x" * 257,
    "x" * 5000,
    "-a",
    "a:b@c.d_e-f",
    "KEPT-1",
    "agent-1",
]
session_id = st.one_of(st.sampled_from(ODD_SESSIONS), st.text(max_size=20)).filter(
    lambda sid: unquote(sid) not in KEPT
)
SUFFIXES = [
    "",
    "/",
    "/traces",
    "/traces?format=chain",
    "/traces?format=x&format=full",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/token",
    "/v1",
    "/v1/chat/completions/",
    "/traces/../../metrics",
    "//traces",
]
TOP = ["/", "", "/health", "/metrics", "/sessions", "/v1/models", "/v1/chat/completions", "//"]
method = st.sampled_from(
    ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW"]
)
ADMIN = [(b"authorization", b"Bearer " + TOKEN.encode())]
# What an episode's agent holds: the token of its own session, open while the fuzz runs.
AGENT_SESSION = "agent-1"
AGENT = [(b"authorization", b"Bearer " + SessionTokens(TOKEN).mint(AGENT_SESSION).encode())]
auth = st.one_of(
    st.just(ADMIN),
    st.just(ADMIN),
    st.just(AGENT),
    st.just(AGENT),
    st.sampled_from(
        [
            [],
            [(b"authorization", b"Bearer wrong")],
            [(b"authorization", b"Bearer " + TOKEN.encode() + b"\x00")],
            [(b"authorization", b"\xff\xfe")],
            [(b"authorization", b"Basic " + TOKEN.encode())],
            [(b"authorization", b"Bearer wrong"), (b"authorization", b"Bearer " + TOKEN.encode())],
        ]
    ),
)
content_length = st.sampled_from(
    [None, b"abc", b"-1", b"", b"99999999999999999999", b"0", b"1", b"1e3", b" 5", b"\xff"]
)


@dataclass
class Request:
    method: str
    target: str
    body: bytes
    headers: list[tuple[bytes, bytes]]


def _target(sid: str, suffix: str) -> str:
    return "/sessions/" + quote(sid, safe="/%:@") + suffix


@st.composite
def any_request(draw: st.DrawFn) -> Request:
    """Any method on any route, odd session ids, odd auth and Content-Length, any body."""
    target = draw(
        st.one_of(
            st.sampled_from(TOP),
            st.builds(_target, session_id, st.sampled_from(SUFFIXES)),
            st.text(max_size=30).map(lambda t: "/" + quote(t, safe="/%?&=")),
        )
    )
    headers = [*draw(auth)]
    declared = draw(content_length)
    if declared is not None:
        headers.append((b"content-length", declared))
    body = draw(st.one_of(raw_body, st.builds(_json, chat_body, st.booleans())))
    return Request(draw(method), target, body, headers)


@st.composite
def model_call(draw: st.DrawFn) -> Request:
    """A POST to a model route on a fresh session, with a hostile but JSON-shaped body."""
    route, shape = draw(
        st.sampled_from(
            [
                ("/v1/chat/completions", chat_body),
                ("/v1/chat/completions", plain_chat),
                ("/v1/completions", completion_body),
                ("/v1/completions", st.fixed_dictionaries({"prompt": plain_text})),
                ("/v1/responses", responses_body),
                ("/v1/responses", plain_responses),
            ]
        )
    )
    sid = draw(st.sampled_from(["f-1", "f-2", "f:3@x", "f.4"]))
    body = _json(draw(shape), draw(st.booleans()))
    return Request("POST", f"/sessions/{sid}{route}", body, list(ADMIN))


# ---------------------------------------------------------------------------- drivers


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class InProcess:
    """Calls the gateway's ASGI app directly, as uvicorn would (its path decoding included),
    on one event loop for the whole test."""

    def __init__(self, gateway: Gateway) -> None:
        self.app = gateway.app
        self.runner = asyncio.Runner()

    def close(self) -> None:
        self.runner.close()

    def __call__(self, request: Request) -> Answer:
        return self.runner.run(self._call(request))

    async def _call(self, request: Request) -> Answer:
        raw_path, _, query = request.target.encode("ascii").partition(b"?")
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [*request.headers, (b"host", b"test")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        chunks = [request.body[i : i + 16384] for i in range(0, len(request.body), 16384)] or [b""]
        done = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if chunks:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            assert not done.is_set(), f"sent after the response ended: {message}"
            if message["type"] == "http.response.start":
                assert not sent, "a second response start"
            else:
                assert sent, "a body before the response start"
                if not message.get("more_body", False):
                    done.set()
            sent.append(message)

        await asyncio.wait_for(self.app(scope, receive, send), 30)
        assert done.is_set(), f"{request.method} {request.target}: the response never ended"
        start = sent[0]
        return Answer(
            start["status"],
            dict(start["headers"]),
            b"".join(m.get("body", b"") for m in sent[1:]),
        )


def over_http(gateway: Gateway, request: Request) -> Answer:
    """One request over a fresh connection to the real uvicorn server, sent as written."""
    host, port = gateway.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        lines = [f"{request.method} {request.target} HTTP/1.1".encode(), b"host: test"]
        lines += [name + b": " + value for name, value in request.headers]
        if not any(name == b"content-length" for name, _ in request.headers):
            lines.append(b"content-length: " + str(len(request.body)).encode())
        lines.append(b"connection: close")
        data = b""
        # uvicorn may answer and close a request it cannot parse before it was all sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + request.body)
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    if not data:
        # uvicorn closed a connection whose request line or headers it could not parse.
        return Answer(400, {}, b"")
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in header_lines)
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _dechunk(body)
    return Answer(int(status_line.split()[1]), headers, body)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        length = int(size, 16)
        if length == 0:
            break
        out += rest[:length]
        data = rest[length + 2 :]
    return out


# ---------------------------------------------------------------------------- properties


def check(request: Request, answer: Answer, *, uvicorn_parse_error_ok: bool = False) -> None:
    """A 2xx, or a 4xx in the OpenAI error shape; a started stream holds no error event."""
    where = f"{request.method} {request.target[:200]!r} -> {answer.status}: {answer.body[:300]!r}"
    assert answer.status < 500, where
    if answer.status >= 400:
        if uvicorn_parse_error_ok and not answer.body.startswith(b"{"):
            return  # uvicorn's own answer to a request it could not parse
        if request.method == "HEAD":
            return
        error = json.loads(answer.body)
        assert set(error) == {"error"}, where
        assert set(error["error"]) == {"message", "type", "param", "code"}, where
        assert isinstance(error["error"]["message"], str) and error["error"]["message"], where
        return
    assert 200 <= answer.status < 300, where
    if answer.headers.get(b"content-type") == b"text/event-stream":
        assert b'data: {"error"' not in answer.body, where
    elif request.method != "HEAD":
        json.loads(answer.body)


@dataclass
class Fuzzed:
    gateway: Gateway
    store: MemoryTraceStore
    before: dict[str, bytes]

    def read(self, path: str) -> Answer:
        connection = http.client.HTTPConnection(*self.gateway.base_url[7:].split(":"), timeout=30)
        try:
            connection.request("GET", path, headers={"authorization": f"Bearer {TOKEN}"})
            response = connection.getresponse()
            return Answer(response.status, {}, response.read())
        finally:
            connection.close()

    def traces(self) -> dict[str, bytes]:
        return {
            f"{sid}{fmt}": self.read(f"/sessions/{sid}/traces{fmt}").body
            for sid in KEPT
            for fmt in ("", "?format=chain")
        }

    def still_sound(self) -> None:
        """The gateway still serves a model call, and the acknowledged traces are intact."""
        assert self.traces() == self.before
        connection = http.client.HTTPConnection(*self.gateway.base_url[7:].split(":"), timeout=30)
        try:
            connection.request(
                "POST",
                "/sessions/after/v1/chat/completions",
                body=json.dumps({"messages": [{"role": "user", "content": "after"}]}),
                headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
            )
            response = connection.getresponse()
            assert response.status == 200
            assert "after" in json.loads(response.read())["choices"][0]["message"]["content"]
        finally:
            connection.close()
        metrics = json.loads(self.read("/metrics").body)
        assert not [s for s in metrics["status_counts"] if s.startswith("5")], metrics


class DrippingEcho(ScriptedSampler):
    """A streaming sampler: each scripted completion handed out token by token,
    ``token_delay_s`` apart (0: at once); a plain call waits ``delay_s``."""

    token_delay_s = 0.0

    async def sample_stream(self, request: SampleRequest) -> Any:
        result = await self.sample(request)
        for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            yield [token], [logprob]
        yield result


@pytest.fixture
def fuzzed() -> Any:
    """A real gateway (uvicorn, in a background thread) with two acknowledged sessions."""
    toy = ToyChatRenderer()
    store = MemoryTraceStore()
    stops = set(toy.stop_token_ids())

    def echo(request: SampleRequest) -> list[int]:
        # The prompt's tail is the reply: hostile text comes back as sampled tokens, control
        # tokens and tool-call markup included.
        tail = [t for t in request.prompt_token_ids[-120:] if t not in stops]
        return [*tail, toy.stop_token_ids()[0]]

    sampler = DrippingEcho(echo, renderer=toy)
    gateway = Gateway(
        renderer=toy, sampler=sampler, trace_store=store, token=TOKEN, max_body_bytes=MAX_BODY
    )
    gateway.start()
    try:
        state = Fuzzed(gateway, store, {})
        for sid in KEPT:
            for turn in range(2):
                connection = http.client.HTTPConnection(*gateway.base_url[7:].split(":"))
                messages = [{"role": "user", "content": f"{sid} turn {turn}"}]
                connection.request(
                    "POST",
                    f"/sessions/{sid}/v1/chat/completions",
                    body=json.dumps({"messages": messages}),
                    headers={"authorization": f"Bearer {TOKEN}"},
                )
                assert connection.getresponse().status == 200
                connection.close()
        gateway.session_token(AGENT_SESSION)
        state.before = state.traces()
        assert all(b'"traces":[{' in v or b'"records":[{' in v for v in state.before.values())
        yield state
    finally:
        gateway.stop()


PROPERTIES: dict[str, tuple[Callable[[], st.SearchStrategy[Request]], int, bool]] = {
    # name: (strategy, default examples, over real uvicorn)
    "any route, in-process": (any_request, 150, False),
    "model call bodies, in-process": (model_call, 150, False),
    "any route, over uvicorn": (any_request, 50, True),
}


def _run_property(name: str, fuzzed: Fuzzed, counts: dict[str, int], factor: int) -> None:
    make, examples, uvicorn = PROPERTIES[name]
    driver = None if uvicorn else InProcess(fuzzed.gateway)
    label = name if factor == 1 else f"{name} (soak x{factor})"
    counts.setdefault(label, 0)

    @settings(
        max_examples=examples * factor,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(make())
    def prop(request: Request) -> None:
        counts[label] += 1
        if driver is None:
            check(request, over_http(fuzzed.gateway, request), uvicorn_parse_error_ok=True)
        else:
            check(request, driver(request))

    try:
        prop()
    finally:
        if driver is not None:
            driver.close()
    fuzzed.still_sound()


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_hostile_requests_get_a_2xx_or_a_4xx_and_lose_nothing(name, fuzzed, fuzz_counts):
    _run_property(name, fuzzed, fuzz_counts, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROPERTIES))
def test_soak_hostile_requests(name, fuzzed, fuzz_counts):
    _run_property(name, fuzzed, fuzz_counts, SOAK_REPEATS)


# ---------------------------------------------------------------------------- regressions


def _post(gateway: Gateway, path: str, body: dict[str, Any]) -> Answer:
    connection = http.client.HTTPConnection(*gateway.base_url[7:].split(":"), timeout=30)
    try:
        connection.request(
            "POST", path, body=json.dumps(body), headers={"authorization": f"Bearer {TOKEN}"}
        )
        response = connection.getresponse()
        return Answer(response.status, {}, response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("stream", [False, True])
def test_deleting_a_session_during_its_model_call_records_nothing_and_loses_nothing(fuzzed, stream):
    gateway = fuzzed.gateway
    sampler = gateway.engine.sampler
    sampler.delay_s = 0.3
    calls = sampler.calls
    answers: list[Answer] = []
    body = {"messages": [{"role": "user", "content": "doomed"}], "stream": stream}
    call = threading.Thread(
        target=lambda: answers.append(_post(gateway, "/sessions/doomed/v1/chat/completions", body))
    )
    call.start()
    deadline = time.monotonic() + 5
    while sampler.calls == calls and time.monotonic() < deadline:
        time.sleep(0.005)
    connection = http.client.HTTPConnection(*gateway.base_url[7:].split(":"), timeout=30)
    connection.request("DELETE", "/sessions/doomed", headers={"authorization": f"Bearer {TOKEN}"})
    deleted = connection.getresponse()
    assert deleted.status == 200, deleted.read()
    connection.close()
    call.join(10)
    [answer] = answers
    assert answer.status == 200, answer.body
    assert answer.body.endswith(b"data: [DONE]\n\n" if stream else b"}")
    # The call completed after its session was deleted: nothing of it was recorded.
    assert fuzzed.read("/sessions/doomed/traces").status == 404
    assert fuzzed.store.session("doomed") == []
    sampler.delay_s = 0.0
    fuzzed.still_sound()


def test_a_client_leaving_mid_stream_leaves_the_server_serving(fuzzed):
    gateway = fuzzed.gateway
    sampler = gateway.engine.sampler
    sampler.token_delay_s = 0.01
    host, port = gateway.base_url[7:].split(":")
    body = json.dumps({"messages": [{"role": "user", "content": "y" * 100}], "stream": True})
    for keep_reading in (0, 1, 3):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /sessions/leaver/v1/chat/completions HTTP/1.1\r\nhost: test\r\n"
                + f"authorization: Bearer {TOKEN}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body.encode()
            )
            for _ in range(keep_reading):
                assert sock.recv(4096)
        # The socket is closed with the stream unfinished.
    sampler.token_delay_s = 0.0
    deadline = time.monotonic() + 5
    while json.loads(fuzzed.read("/metrics").body)["in_flight"] > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fuzzed.store.session("leaver") == []
    fuzzed.still_sound()


@pytest.mark.parametrize(
    ("prompt", "code", "message"),
    [
        # Found by the fuzzing: an id outside the vocabulary reached the tokenizer (a 500).
        ([263], "invalid_request", "holds token ids the renderer cannot decode (KeyError: 263)"),
        ([-1], "invalid_value", "prompt token id -1 is outside 0..2147483647"),
        ([2**70], "invalid_value", f"prompt token id {2**70} is outside 0..2147483647"),
    ],
)
def test_a_prompt_of_unknown_token_ids_is_a_400_and_records_nothing(fuzzed, prompt, code, message):
    sampler = fuzzed.gateway.engine.sampler
    calls = sampler.calls
    answer = _post(fuzzed.gateway, "/sessions/ids/v1/completions", {"prompt": prompt})
    assert answer.status == 400, answer.body
    error = json.loads(answer.body)["error"]
    assert message in error["message"]
    assert error["code"] == code
    assert sampler.calls == calls
    assert fuzzed.store.session("ids") == []


def test_a_lone_surrogate_escape_is_a_400_naming_it(fuzzed):
    # Found by the fuzzing: msgspec calls such a body "truncated", which it is not.
    body = {"messages": [{"role": "user", "content": "a\ud800"}]}
    answer = _post(fuzzed.gateway, "/sessions/odd/v1/chat/completions", body)
    assert answer.status == 400
    error = json.loads(answer.body)["error"]
    assert error["code"] == "invalid_json"
    assert error["message"] == (
        "the request body is not valid JSON: \\ud800 at byte 44 is half of a UTF-16 surrogate"
        " pair, not a character; send the character itself in UTF-8"
    )
