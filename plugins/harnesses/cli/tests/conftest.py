"""Fixtures for the cli harness tests: a real gateway on an ephemeral port backed by a scripted
sampler and an in-memory trace store, and a scripted fake sandbox with in-memory files."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
from rllm_core.errors import SandboxCommandTimeout, SandboxFileNotFound
from rllm_core.types import ExecResult


@dataclass
class Call:
    command: str
    timeout: float
    user: str | None
    env: Mapping[str, str] | None
    cwd: str | None


class FakeSandbox:
    """Files in a dict; ``exec`` answers with ``handler(call, files)``: an ExecResult, an
    exception to raise, or ``None`` for exit 0 with no output. A handler returning
    ``"timeout"`` raises ``SandboxCommandTimeout``."""

    merges_output = False

    def __init__(self, handler: Callable[[Call, dict[str, bytes]], Any] | None = None) -> None:
        self.handler = handler or (lambda call, files: None)
        self.files: dict[str, bytes] = {}
        self.calls: list[Call] = []

    async def exec(self, command, timeout, user=None, env=None, cwd=None) -> ExecResult:
        call = Call(command, timeout, user, dict(env) if env is not None else None, cwd)
        self.calls.append(call)
        answer = self.handler(call, self.files)
        if answer == "timeout":
            raise SandboxCommandTimeout("killed", command=command, timeout_s=timeout)
        if isinstance(answer, BaseException):
            raise answer
        return answer or ExecResult(exit_code=0, stdout="", stderr="")

    async def write_file(self, path: str, data: bytes) -> None:
        self.files[path] = bytes(data)

    async def read_file(self, path: str) -> bytes:
        if path not in self.files:
            raise SandboxFileNotFound(f"no file {path}")
        return self.files[path]

    async def list_files(self, path: str):
        return []

    async def is_alive(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> FakeSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@pytest.fixture
def fake_sandbox() -> type[FakeSandbox]:
    return FakeSandbox
