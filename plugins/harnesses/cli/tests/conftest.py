"""Fixtures for the cli harness tests: a real gateway on an ephemeral port backed by a scripted
sampler and an in-memory trace store, and a scripted fake sandbox with in-memory files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from reference.fake_sandbox import Call, ScriptedSandbox
from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
from rllm_core.errors import SandboxCommandTimeout, SandboxFileNotFound


class FakeSandbox(ScriptedSandbox):
    """Files in a dict; ``exec`` answers with ``handler(call, files)``: an ExecResult, an
    exception to raise, or ``None`` for exit 0 with no output. A handler returning
    ``"timeout"`` raises ``SandboxCommandTimeout``."""

    def __init__(self, handler: Callable[[Call, dict[str, bytes]], Any] | None = None) -> None:
        super().__init__()
        self.handler = handler or (lambda call, files: None)
        self.files: dict[str, bytes] = {}

    def answer(self, call: Call) -> Any:
        answer = self.handler(call, self.files)
        if answer == "timeout":
            raise SandboxCommandTimeout("killed", command=call.command, timeout_s=call.timeout)
        return answer

    async def write_file(self, path: str, data: bytes) -> None:
        self.files[path] = bytes(data)

    async def read_file(self, path: str) -> bytes:
        if path not in self.files:
            raise SandboxFileNotFound(f"no file {path}")
        return self.files[path]

    async def list_files(self, path: str):
        return []


@pytest.fixture
def fake_sandbox() -> type[FakeSandbox]:
    return FakeSandbox
