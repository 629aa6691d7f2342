"""Slow model calls: a plain answer sends its status only once it is known; a stream starts
with SSE comment heartbeats that keep the connection alive; the request timeout bounds both."""

from __future__ import annotations

import json

import openai
import pytest
from rllm_core.testing.samplers import ScriptedSampler

CHAT = "/sessions/s/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def test_a_slow_json_response_waits_for_its_status_without_heartbeats(serve, raw, client, toy):
    sampler = ScriptedSampler(["late", "late again"], renderer=toy, delay_s=0.45)
    gateway = serve(sampler, heartbeat_interval_s=0.1)
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 200
    assert response.body.startswith(b"{")
    assert response.headers["content-length"] == str(len(response.body))
    assert json.loads(response.body)["choices"][0]["message"]["content"] == "late"

    reply = client(gateway, "s2").chat.completions.create(model="policy", messages=HI)
    assert reply.choices[0].message.content == "late again"


def test_a_fast_response_has_no_heartbeat(serve, raw, toy):
    gateway = serve(ScriptedSampler(["quick"], renderer=toy), heartbeat_interval_s=5.0)
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.body.startswith(b"{")
    assert response.headers["content-length"] == str(len(response.body))


def test_a_slow_stream_sends_sse_comments_first(serve, raw, toy):
    sampler = ScriptedSampler(["late"], renderer=toy, delay_s=0.45)
    gateway = serve(sampler, heartbeat_interval_s=0.1)
    response = raw(gateway)("POST", CHAT, {"messages": HI, "stream": True})
    assert response.headers["content-type"] == "text/event-stream"
    events = response.body.decode().split("\n\n")
    comments = [e for e in events if e.startswith(":")]
    assert 2 <= len(comments) <= 5
    assert events.index(comments[-1]) < events.index(next(e for e in events if "data:" in e))
    assert events[-2] == "data: [DONE]"


def test_the_timeout_of_a_slow_call_is_a_504_or_an_event_after_stream_heartbeats(
    serve, raw, client, toy
):
    sampler = ScriptedSampler(["never"], renderer=toy, delay_s=5.0)
    gateway = serve(sampler, heartbeat_interval_s=0.05, request_timeout_s=0.3)
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 504
    assert response.error["code"] == "timeout"
    assert "did not finish within 0.3s" in response.error["message"]

    streamed = raw(gateway)("POST", CHAT, {"messages": HI, "stream": True})
    assert streamed.status == 200
    events = streamed.body.decode().split("\n\n")
    assert events[0] == ": keep-alive"
    assert events[-2] == "data: [DONE]"
    assert json.loads(events[-3].removeprefix("data: "))["error"]["code"] == "timeout"

    # The official client raises the error event rather than return a partial answer.
    stream = client(gateway, "s2").chat.completions.create(model="policy", messages=HI, stream=True)
    with pytest.raises(openai.APIError, match=r"did not finish within 0\.3s"):
        list(stream)


def test_the_timeout_before_any_heartbeat_is_a_504(serve, raw, toy, store):
    sampler = ScriptedSampler(["never", "in time"], renderer=toy, delay_s=0.5)
    gateway = serve(sampler, heartbeat_interval_s=10.0, request_timeout_s=0.2)
    response = raw(gateway)("POST", CHAT, {"messages": HI})
    assert response.status == 504
    assert response.error["type"] == "timeout_error"
    # The abandoned call left no trace, and the session still works.
    assert store.chain("s") == []
    sampler.delay_s = 0.0
    assert raw(gateway)("POST", CHAT, {"messages": HI}).status == 200
