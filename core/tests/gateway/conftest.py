"""Fixtures for the gateway's HTTP tests: gateways served on ephemeral ports, the official
``openai`` client pointed at a session, raw HTTP for what that client will not send, and fake
vLLM workers."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from reference.gateway_fixtures import client, serve, store, toy, workers  # noqa: F401
from rllm_core.gateway.server import Gateway

_DEFAULT = object()


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        """The OpenAI error object; fails the test when the body is not that shape."""
        data = self.json()
        assert set(data) == {"error"}, data
        assert set(data["error"]) == {"message", "type", "param", "code"}, data
        return data["error"]


class RawClient:
    """Plain HTTP/1.1 requests to a gateway, one connection each."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        parts = urlsplit(gateway.base_url)
        self.host = parts.hostname
        self.port = parts.port

    def __call__(
        self,
        method: str,
        path: str,
        body: bytes | str | dict | None = None,
        *,
        token: Any = _DEFAULT,
        headers: dict[str, str] | None = None,
        chunked: bool = False,
    ) -> RawResponse:
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        sent = {"content-type": "application/json"}
        if token is _DEFAULT:
            token = self.gateway.token
        if token is not None:
            sent["authorization"] = f"Bearer {token}"
        sent.update(headers or {})
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            if chunked:
                connection.putrequest(method, path)
                for name, value in sent.items():
                    connection.putheader(name, value)
                connection.putheader("transfer-encoding", "chunked")
                connection.endheaders()
                data = body or b""
                for start in range(0, len(data), 65536):
                    piece = data[start : start + 65536]
                    connection.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                connection.send(b"0\r\n\r\n")
            else:
                connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            return RawResponse(
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                response.read(),
            )
        finally:
            connection.close()


@pytest.fixture
def raw() -> Callable[[Gateway], RawClient]:
    return RawClient
