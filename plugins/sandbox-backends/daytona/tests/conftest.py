"""Fixtures of the daytona tests: a network guard, the fake client and a backend over it.

The guard (autouse, skipped for tests marked ``live``) makes every attempt to resolve a
remote host name or connect a socket to a remote address fail at once, so a test that reaches
the real SDK's network path fails in milliseconds instead of waiting on a timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rllm_sandbox_backend_daytona.backend import DaytonaBackend

# The fake lives next to the tests; pytest's importlib mode does not put this folder on the path.
sys.path.insert(0, str(Path(__file__).parent))

from fake_daytona import FakeDaytona, fast_config


class NetworkBlocked(ConnectionRefusedError):
    """A test tried to reach the network."""


def _is_local(host: Any) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _blocked(what: object) -> NetworkBlocked:
    return NetworkBlocked(f"network access is blocked in offline tests: {what}")


@pytest.fixture(autouse=True)
def network_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("live"):
        return
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_sock_connect = asyncio.selector_events.BaseSelectorEventLoop.sock_connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_local(host):
            raise socket.gaierror(socket.EAI_NONAME, f"name resolution is blocked: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    def remote(sock: socket.socket, address: Any) -> bool:
        return sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0])

    def connect(self: socket.socket, address: Any) -> None:
        if remote(self, address):
            raise _blocked(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if remote(self, address):
            raise _blocked(address)
        return real_connect_ex(self, address)

    async def sock_connect(self: Any, sock: socket.socket, address: Any) -> None:
        if remote(sock, address):
            raise _blocked(address)
        return await real_sock_connect(self, sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(asyncio.selector_events.BaseSelectorEventLoop, "sock_connect", sock_connect)


@pytest.fixture
def fake_client(tmp_path: Path) -> Iterator[FakeDaytona]:
    root = tmp_path / "fake-daytona"
    root.mkdir()
    client = FakeDaytona(root)
    yield client
    asyncio.run(client.destroy_all())


@pytest.fixture
def backend(fake_client: FakeDaytona) -> DaytonaBackend:
    return DaytonaBackend(fast_config(), client=fake_client)
