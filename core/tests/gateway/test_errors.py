"""Bad input gets a clear 4xx in the OpenAI error shape, failures upstream a 5xx, and the
server keeps serving after every one of them."""

from __future__ import annotations

import logging

import openai
import pytest
from rllm_core.errors import UpstreamError, UpstreamUnavailableError
from rllm_core.testing.samplers import ScriptedSampler

CHAT = "/sessions/s/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gateway(serve, toy):
    return serve(ScriptedSampler(lambda request: "fine", renderer=toy), max_body_bytes=4096)


def still_serving(gateway, raw) -> None:
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 200, response.body
    assert response.json()["choices"][0]["message"]["content"] == "fine"


def test_malformed_json_is_a_400_naming_the_problem(gateway, raw):
    response = raw(gateway)("POST", CHAT, '{"messages": [')
    assert response.status == 400
    error = response.error
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_json"
    assert error["message"] == "the request body is not valid JSON: Input data was truncated"
    still_serving(gateway, raw)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"messages": HI, "max_tokens": "ten"},
            "max_tokens",
            "field 'max_tokens': expected `int | null`, got `str`",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "field 'messages[0].content': expected `str | array | null`, got `int`",
        ),
        (
            {"messages": HI, "temperature": "hot"},
            "temperature",
            "field 'temperature': expected `float | null`, got `str`",
        ),
        (
            {"messages": HI, "stream": "yes"},
            "stream",
            "field 'stream': expected `bool | null`, got `str`",
        ),
        (
            {"messages": "hi"},
            "messages",
            "field 'messages': expected `array`, got `str`",
        ),
        (
            {"messages": HI, "tools": [{"type": "function"}]},
            "tools[0].function",
            "missing required field 'tools[0].function'",
        ),
        ({"model": "policy"}, "messages", "missing required field 'messages'"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_400_naming_the_field(gateway, raw, body, param, message):
    response = raw(gateway)("POST", CHAT, body)
    assert response.status == 400
    assert response.error["param"] == param
    assert response.error["message"] == message
    still_serving(gateway, raw)


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"messages": []}, "messages", "at least one message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'robot'"),
        ({"messages": HI, "n": 2}, "n", "n is 2"),
        ({"messages": HI, "tool_choice": "required"}, "tool_choice", "offers no tools"),
        ({"messages": HI, "tool_choice": "any"}, "tool_choice", "'any' is unknown"),
        (
            {"messages": HI, "response_format": {"type": "json_object"}},
            "response_format",
            "response_format {'type': 'json_object'} is not supported",
        ),
        (
            {
                "messages": HI,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
            },
            "response_format",
            "response_format {'type': 'json_schema'} is not supported",
        ),
        ({"messages": HI, "stop": ["\n"]}, "stop", "stop sequences are not supported"),
        ({"messages": HI, "top_logprobs": 3}, "top_logprobs", "not supported"),
        ({"messages": HI, "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"messages": HI, "top_p": 1.5}, "top_p", "(0, 1]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
            "only text parts",
        ),
    ],
)
def test_a_value_the_gateway_cannot_honour_is_a_400(gateway, raw, body, param, fragment):
    response = raw(gateway)("POST", CHAT, body)
    assert response.status == 400
    assert response.error["param"] == param
    assert fragment in response.error["message"]
    still_serving(gateway, raw)


def test_an_oversize_body_is_a_413_whether_declared_or_streamed(gateway, raw):
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    declared = raw(gateway)("POST", CHAT, big)
    assert declared.status == 413
    assert declared.error["code"] == "body_too_large"
    assert "over the gateway's limit of 4096" in declared.error["message"]
    streamed = raw(gateway)("POST", CHAT, big, chunked=True)
    assert streamed.status == 413
    assert streamed.error["code"] == "body_too_large"
    still_serving(gateway, raw)


def test_a_missing_or_wrong_token_is_a_401(gateway, raw, client):
    missing = raw(gateway)("POST", CHAT, {"messages": HI}, token=None)
    assert missing.status == 401
    assert missing.error["code"] == "missing_api_key"
    assert "Authorization: Bearer" in missing.error["message"]
    wrong = raw(gateway)("GET", "/sessions", token="not-the-token")
    assert wrong.status == 401
    assert wrong.error["type"] == "authentication_error"
    assert wrong.error["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "s", api_key="nope").chat.completions.create(model="p", messages=HI)
    still_serving(gateway, raw)


def test_an_unknown_session_on_a_read_endpoint_is_a_404(gateway, raw):
    http = raw(gateway)
    for method, path in [
        ("GET", "/sessions/ghost/traces"),
        ("GET", "/sessions/ghost/traces?format=chain"),
        ("GET", "/sessions/ghost"),
        ("DELETE", "/sessions/ghost"),
    ]:
        response = http(method, path)
        assert response.status == 404, (method, path)
        assert response.error["code"] == "unknown_session"
        assert "'ghost'" in response.error["message"]
    still_serving(gateway, raw)


def test_unknown_routes_wrong_methods_and_bad_session_ids(gateway, raw):
    http = raw(gateway)
    unknown = http("POST", "/v1/chat/completions", {"messages": HI})
    assert unknown.status == 404
    assert unknown.error["message"] == (
        "no route POST /v1/chat/completions; model calls go to"
        " /sessions/{session_id}/v1/chat/completions"
    )
    wrong_method = http("GET", CHAT)
    assert wrong_method.status == 405
    assert wrong_method.headers["allow"] == "POST"
    assert wrong_method.error["code"] == "method_not_allowed"
    bad_id = http("POST", "/sessions/..%2Fetc/v1/chat/completions", {"messages": HI})
    assert bad_id.status == 400
    assert bad_id.error["param"] == "session_id"
    bad_format = http("GET", "/sessions/s/traces?format=xml")
    assert (bad_format.status, bad_format.error["param"]) == (400, "format")
    still_serving(gateway, raw)


def test_an_over_long_prompt_is_a_400_with_the_counts(serve, raw, toy, client):
    gateway = serve(ScriptedSampler(["never"], renderer=toy), max_prompt_tokens=10)
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 400
    assert response.error["code"] == "prompt_too_long"
    assert "has 21 tokens, over the gateway's limit of 10" in response.error["message"]
    with pytest.raises(openai.BadRequestError):
        client(gateway, "s").chat.completions.create(model="policy", messages=HI)


def test_upstream_failures_map_to_502_and_503(serve, raw, toy):
    failures = iter(
        [
            UpstreamUnavailableError("no upstream worker is reachable"),
            UpstreamError("gave up after 5 attempt(s)"),
        ]
    )

    def reply(request):
        error = next(failures, None)
        if error is not None:
            raise error
        return "recovered"

    gateway = serve(ScriptedSampler(reply, renderer=toy))
    http = raw(gateway)
    unavailable = http("POST", CHAT, {"messages": HI})
    assert unavailable.status == 503
    assert unavailable.headers["retry-after"] == "5"
    assert unavailable.error == {
        "message": "no upstream worker is reachable",
        "type": "upstream_error",
        "param": None,
        "code": "upstream_unavailable",
    }
    failed = http("POST", CHAT, {"messages": HI})
    assert failed.status == 502
    assert failed.error["code"] == "upstream_error"
    ok = http("POST", CHAT, {"messages": HI})
    assert ok.json()["choices"][0]["message"]["content"] == "recovered"


def test_an_unexpected_exception_is_a_logged_500_and_the_server_lives(serve, raw, toy, caplog):
    calls = []

    def reply(request):
        calls.append(request)
        if len(calls) == 1:
            raise ZeroDivisionError("division by zero")
        return "alive"

    gateway = serve(ScriptedSampler(reply, renderer=toy))
    with caplog.at_level(logging.ERROR, logger="rllm_core.gateway"):
        response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 500
    assert response.error["type"] == "server_error"
    assert "ZeroDivisionError: division by zero" in response.error["message"]
    assert any(
        "POST /sessions/s/v1/chat/completions failed" in r.message and r.exc_info
        for r in caplog.records
    )
    assert raw(gateway)("POST", CHAT, {"messages": HI}).json()["choices"][0]["message"][
        "content"
    ] == ("alive")
    metrics = raw(gateway)("GET", "/metrics").json()
    assert metrics["status_counts"] == {"200": 1, "500": 1}


def test_openai_client_raises_the_matching_exceptions(gateway, client):
    api = client(gateway, "s")
    with pytest.raises(openai.BadRequestError) as bad:
        api.chat.completions.create(model="policy", messages=HI, n=3)
    assert bad.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(
            base_url=gateway.base_url + "/v1", api_key=gateway.token, max_retries=0
        ).chat.completions.create(model="policy", messages=HI)
