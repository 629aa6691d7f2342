"""Fixtures of the modal backend's tests, and the guard that keeps them offline.

Outside tests marked ``live``, any attempt to build a real Modal client (the only way the SDK
reaches the network) fails at once with an AssertionError, so a test that forgot to inject
the fake fails in milliseconds instead of waiting on a connection.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_FAKE_MODULE = "rllm_sandbox_backend_modal_tests_fake"


def _load_fake():
    if _FAKE_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            _FAKE_MODULE, Path(__file__).with_name("modal_fake.py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[_FAKE_MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[_FAKE_MODULE]


fake = _load_fake()


@pytest.fixture(autouse=True)
def _offline_modal(request, monkeypatch):
    if request.node.get_closest_marker("live"):
        yield
        return
    from modal.client import _Client

    def refuse(*args, **kwargs):
        raise AssertionError(
            "a test tried to reach the Modal service; inject the fake through"
            " ModalBackend(config, client=FakeModal()) or mark the test `live`"
        )

    async def refuse_async(*args, **kwargs):
        refuse()

    monkeypatch.setattr(_Client, "__init__", refuse)
    monkeypatch.setattr(_Client, "from_env", classmethod(refuse_async))
    monkeypatch.setattr(_Client, "from_credentials", classmethod(refuse_async))
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    monkeypatch.setenv("MODAL_SERVER_URL", "http://127.0.0.1:9")
    yield


@pytest.fixture
def fake_modal():
    return fake.FakeModal()
