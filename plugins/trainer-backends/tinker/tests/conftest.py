"""Fixtures of the tinker backend's tests, and the guard that keeps them offline.

Outside tests marked ``live``, building a real ``tinker.ServiceClient`` or opening a network
connection fails at once with an AssertionError, so a test that forgot to inject the fake
fails in milliseconds instead of waiting on Tinker.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

_FAKE_MODULE = "rllm_trainer_backend_tinker_tests_fake"


def _load_fake():
    if _FAKE_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            _FAKE_MODULE, Path(__file__).with_name("tinker_fake.py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[_FAKE_MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[_FAKE_MODULE]


_load_fake()

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture(autouse=True)
def _offline_tinker(request, monkeypatch):
    if request.node.get_closest_marker("live"):
        yield
        return
    import tinker

    def refuse_client(*args, **kwargs):
        raise AssertionError(
            "network guard: this offline test built a real tinker.ServiceClient; inject"
            " FakeService through service_client="
        )

    real_connect = socket.socket.connect

    def refuse_remote(self, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and host not in _LOCAL_HOSTS:
            raise AssertionError(f"network guard: this offline test connected to {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(tinker.ServiceClient, "__init__", refuse_client)
    monkeypatch.setattr(socket.socket, "connect", refuse_remote)
    yield
