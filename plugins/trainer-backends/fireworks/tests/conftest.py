"""Fixtures of the fireworks tests: a guard that fails any remote connection at once (tests
marked ``live`` are exempt), the fake service and a backend over it."""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

# pytest's importlib mode does not put this folder on the path.
sys.path.insert(0, str(Path(__file__).parent))


def _remote(host: Any) -> bool:
    if host in (None, "", "localhost"):
        return False
    try:
        return not ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return True


@pytest.fixture(autouse=True)
def network_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("live"):
        return
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if _remote(host):
            raise socket.gaierror(socket.EAI_NONAME, f"offline test tried to resolve {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and _remote(address[0]):
            raise ConnectionRefusedError(f"offline test tried to connect to {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def service() -> Any:
    """A fresh :class:`fake_fireworks.FakeService`."""
    from fake_fireworks import FakeService

    return FakeService()


@pytest.fixture
def backend(service: Any) -> Any:
    """A backend built with :data:`fake_fireworks.CONFIG` over ``service``."""
    from fake_fireworks import CONFIG
    from rllm_trainer_backend_fireworks.backend import FireworksBackend

    return FireworksBackend(CONFIG, service=service)
