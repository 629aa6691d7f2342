"""Who may reach what: the admin token reaches every route, a session token only its own
session's model routes and only while the session is open; every refusal is counted and
logged."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.app import LOGGED_DENIALS
from rllm_core.gateway.engine import (
    ChatRequest,
    GatewayEngine,
    SessionClosedError,
    calls_open_sessions,
)
from rllm_core.gateway.server import Gateway
from rllm_core.gateway.tokens import SessionTokens
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message

HI = [{"role": "user", "content": "hi"}]
REACH = "/sessions/a/v1/... (chat/completions, completions, responses, models)"


@pytest.fixture
def gateway(serve, toy) -> Gateway:
    return serve(ScriptedSampler(lambda request: "fine", renderer=toy))


@pytest.fixture
def denials() -> Iterator[list[logging.LogRecord]]:
    """The WARNING records of the ``rllm_core.gateway`` logger during the test."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("rllm_core.gateway")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def over_http(gateway: Gateway, token: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30.0)


def chat(gateway: Gateway, session_id: str, api_key: str) -> str:
    api = openai.OpenAI(base_url=gateway.session_url(session_id), api_key=api_key, max_retries=0)
    reply = api.chat.completions.create(model="policy", messages=HI)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def test_a_session_token_reaches_its_own_model_routes(gateway, store):
    endpoint = gateway.endpoint("a")
    assert endpoint.api_key == gateway.session_token("a") != gateway.token
    assert endpoint.api_key.startswith("rllm-s1.")
    api = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    assert api.chat.completions.create(model="policy", messages=HI).choices[0].message.content == (
        "fine"
    )
    assert api.completions.create(model="policy", prompt="hi").choices[0].text == "fine"
    assert [m.id for m in api.models.list()] == ["policy"]
    with over_http(gateway, endpoint.api_key) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "policy"
    assert [t.record.session_id for t in store.session("a")] == ["a", "a"]


def test_a_session_token_outside_its_session_is_a_403_naming_its_reach(gateway, store):
    chat(gateway, "b", gateway.token)
    token = gateway.session_token("a")
    with over_http(gateway, token) as client:
        for method, path, reason in [
            ("POST", "/sessions/b/v1/chat/completions", "is another session's"),
            ("GET", "/sessions/b/v1/models", "is another session's"),
            ("GET", "/sessions/b/traces", "is another session's"),
            ("DELETE", "/sessions/b", "is another session's"),
            ("POST", "/sessions/b/token", "is another session's"),
            ("GET", "/sessions", "needs the gateway's admin token"),
            ("GET", "/metrics", "needs the gateway's admin token"),
            ("POST", "/sessions/a/token", "needs the gateway's admin token"),
            ("GET", "/sessions/a/traces", "needs the gateway's admin token"),
            ("DELETE", "/sessions/a", "needs the gateway's admin token"),
        ]:
            response = client.request(method, path, json={"messages": HI})
            assert response.status_code == 403, (method, path, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("permission_error", "forbidden")
            assert error["message"] == (
                f"this token belongs to session 'a' and reaches only {REACH} and GET /v1/models;"
                f" {method} {path} {reason}"
            )
    with pytest.raises(openai.PermissionDeniedError, match="belongs to session 'a'"):
        chat(gateway, "b", token)
    assert len(store.session("b")) == 1
    assert gateway.engine.is_open("b")


def test_a_session_token_is_refused_once_its_session_is_released(gateway, store):
    token = gateway.session_token("a")
    assert chat(gateway, "a", token) == "fine"
    gateway.release_session("a")
    with pytest.raises(openai.AuthenticationError) as refused:
        chat(gateway, "a", token)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "session_closed"
    assert "the session token of session 'a' has expired" in error["message"]
    assert not gateway.engine.is_open("a")
    assert len(store.session("a")) == 1
    # The admin token still calls the id, which opens a fresh session.
    assert chat(gateway, "a", gateway.token) == "fine"
    assert chat(gateway, "a", token) == "fine"


def test_a_call_released_while_its_body_arrives_does_not_reopen_the_session(gateway, store):
    token = gateway.session_token("a")
    body = json.dumps({"messages": HI}).encode()
    connection = http.client.HTTPConnection(gateway.host, gateway.port, timeout=30)
    try:
        connection.putrequest("POST", "/sessions/a/v1/chat/completions")
        connection.putheader("authorization", f"Bearer {token}")
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(len(body)))
        connection.endheaders()
        connection.send(body[:5])
        deadline = time.monotonic() + 10
        while gateway.app.metrics.in_flight == 0:  # authorized: now reading the body
            assert time.monotonic() < deadline
            time.sleep(0.005)
        gateway.release_session("a")
        connection.send(body[5:])
        response = connection.getresponse()
        assert response.status == 401
        assert json.loads(response.read())["error"]["code"] == "session_closed"
    finally:
        connection.close()
    assert not gateway.engine.is_open("a")
    assert store.session("a") == []


def test_the_engine_refuses_to_open_a_session_where_opening_is_cleared():
    toy = ToyChatRenderer()
    engine = GatewayEngine(
        renderer=toy, sampler=ScriptedSampler(["x"], renderer=toy), trace_store=MemoryTraceStore()
    )
    request = ChatRequest(messages=(Message(role="user", content="hi"),))

    async def closed_call() -> None:
        calls_open_sessions.set(False)
        await engine.chat("s", request)

    with pytest.raises(SessionClosedError, match="session 's' is closed"):
        asyncio.run(closed_call())
    assert not engine.is_open("s")


def test_the_admin_token_reaches_every_route_and_mints_session_tokens(gateway, store):
    with over_http(gateway, gateway.token) as admin:
        minted = admin.post("/sessions/m/token")
        assert minted.status_code == 200
        token = minted.json()["token"]
        base_url = f"{gateway.base_url}/sessions/m/v1"
        assert minted.json() == {"session_id": "m", "token": token, "base_url": base_url}
        assert token == gateway.session_token("m")
        assert gateway.engine.is_open("m")
        assert chat(gateway, "m", token) == "fine"
        assert chat(gateway, "m", gateway.token) == "fine"
        assert admin.get("/sessions").json()["data"] == ["m"]
        assert admin.get("/sessions/m").json()["session_id"] == "m"
        assert len(admin.get("/sessions/m/traces").json()["traces"]) == 1
        assert admin.get("/metrics").json()["denied"] == {"total": 0, "by_reason": {}}
        assert admin.delete("/sessions/m").json()["deleted"] is True
    assert store.session("m") == []
    with pytest.raises(openai.AuthenticationError, match="session 'm' has expired"):
        chat(gateway, "m", token)


def test_a_gateway_with_the_same_admin_token_accepts_the_session_tokens(gateway, serve, toy):
    token = gateway.session_token("a")
    twin = serve(ScriptedSampler(lambda request: "twin", renderer=toy), token=gateway.token)
    twin.configure_session("a", enforced=None)
    assert chat(twin, "a", token) == "twin"
    other = serve(ScriptedSampler(lambda request: "other", renderer=toy))
    other.configure_session("a", enforced=None)
    with pytest.raises(openai.AuthenticationError, match="the bearer token is wrong"):
        chat(other, "a", token)


def test_missing_wrong_and_forged_tokens_are_401(gateway):
    gateway.session_token("a")
    gateway.session_token("b")
    real = gateway.session_token("a")
    prefix, _, mac = real.split(".")
    forged = [
        "not-a-token",
        SessionTokens("another admin token").mint("a"),
        f"{prefix}.{SessionTokens('x').mint('b').split('.')[1]}.{mac}",  # a's MAC on b's id
        real[:-1],
        real + "=",
        f"{prefix}.YQ.{mac}.",
    ]
    for token in forged:
        with over_http(gateway, token) as client:
            response = client.post("/sessions/a/v1/chat/completions", json={"messages": HI})
        assert response.status_code == 401, token
        assert response.json()["error"]["code"] == "invalid_api_key", token
    with over_http(gateway, None) as client:
        response = client.get("/sessions/a/v1/models")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "missing_api_key")


def test_an_agent_that_keeps_probing_is_counted_in_full_and_logged_in_part(gateway, denials):
    token = gateway.session_token("a")
    with over_http(gateway, token) as client:
        for _ in range(LOGGED_DENIALS + 5):
            assert client.get("/sessions").status_code == 403
    with over_http(gateway, "wrong") as client:
        for _ in range(LOGGED_DENIALS + 5):
            assert client.get("/metrics").status_code == 401
    assert gateway.denied("a") == LOGGED_DENIALS + 5
    assert gateway.app.metrics.denied == 2 * (LOGGED_DENIALS + 5)
    messages = [r.getMessage() for r in denials]
    assert len(messages) == 2 * (LOGGED_DENIALS + 1)
    assert messages.count("denied GET '/sessions': 403 admin_only, a token of session 'a'") == (
        LOGGED_DENIALS
    )
    assert "denied: further refusals of session 'a' are counted in /metrics" in "\n".join(messages)
    assert "denied: further refusals of invalid_token are counted" in "\n".join(messages)
    gateway.release_session("a")
    assert gateway.denied("a") == 0


def test_denials_are_counted_by_reason_listed_and_logged(gateway, denials):
    token = gateway.session_token("a")
    with over_http(gateway, token) as client:
        client.get("/sessions")
        client.get("/sessions/b/traces")
    with over_http(gateway, "wrong") as client:
        client.get("/metrics")
    gateway.release_session("a")
    with over_http(gateway, token) as client:
        client.get("/sessions/a/v1/models")
    metrics = gateway.app.metrics
    assert metrics.denied == 4
    assert dict(metrics.denied_by_reason) == {
        "admin_only": 1,
        "other_session": 1,
        "invalid_token": 1,
        "session_closed": 1,
    }
    listed = metrics.denials_after(0)
    assert [(d.seq, d.status, d.reason, d.method, d.path, d.session_id) for d in listed] == [
        (1, 403, "admin_only", "GET", "/sessions", "a"),
        (2, 403, "other_session", "GET", "/sessions/b/traces", "a"),
        (3, 401, "invalid_token", "GET", "/metrics", None),
        (4, 401, "session_closed", "GET", "/sessions/a/v1/models", "a"),
    ]
    assert metrics.denials_after(3) == listed[3:]
    assert [r.getMessage() for r in denials] == [
        "denied GET '/sessions': 403 admin_only, a token of session 'a'",
        "denied GET '/sessions/b/traces': 403 other_session, a token of session 'a'",
        "denied GET '/metrics': 401 invalid_token",
        "denied GET '/sessions/a/v1/models': 401 session_closed, a token of session 'a'",
    ]
    assert {r.levelno for r in denials} == {logging.WARNING}
    with over_http(gateway, gateway.token) as admin:
        reported = admin.get("/metrics").json()
    assert reported["denied"] == {
        "total": 4,
        "by_reason": {"admin_only": 1, "invalid_token": 1, "other_session": 1, "session_closed": 1},
    }
    assert reported["status_counts"]["403"] == 2


def test_without_auth_every_route_stays_open(serve, toy):
    gateway = serve(ScriptedSampler(lambda request: "open", renderer=toy), auth=False)
    endpoint = gateway.endpoint("a")
    assert (endpoint.api_key, gateway.session_token("a")) == ("none", None)
    assert chat(gateway, "a", "anything") == "open"
    with over_http(gateway, None) as client:
        minted = client.post("/sessions/b/token").json()
        assert (minted["session_id"], minted["token"]) == ("b", None)
        assert minted["base_url"] == f"{gateway.base_url}/sessions/b/v1"
        assert client.get("/sessions").json()["data"] == ["a", "b"]
        assert client.get("/metrics").status_code == 200
    assert gateway.app.metrics.denied == 0


def test_session_tokens_are_deterministic_per_admin_token_and_name_their_session():
    tokens = SessionTokens("admin")
    token = tokens.mint("run-s1.t-0:a0@x")
    assert token == SessionTokens("admin").mint("run-s1.t-0:a0@x")
    assert token != SessionTokens("admin2").mint("run-s1.t-0:a0@x")
    assert tokens.session_of(token) == "run-s1.t-0:a0@x"
    assert SessionTokens("admin2").session_of(token) is None
    assert tokens.session_of("admin") is None
    with pytest.raises(ValueError, match="session id 'bad id' is invalid"):
        tokens.mint("bad id")
