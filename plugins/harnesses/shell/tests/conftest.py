"""Fixtures for the shell harness tests: a real gateway on an ephemeral port backed by a
scripted sampler, the toy renderer and an in-memory trace store; a scripted fake sandbox; and a
fake clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from reference.fake_sandbox import Call, ScriptedSandbox
from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
from rllm_core.errors import SandboxCommandTimeout, SandboxGone
from rllm_core.types import ExecResult


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeSandbox(ScriptedSandbox):
    """Answers ``exec`` with ``handler(call)``: an ExecResult, or an exception to raise.

    When ``clock`` and ``takes_s`` are set, each command takes ``takes_s`` seconds of fake time;
    one that needs more than its timeout advances the clock by the timeout and raises
    ``SandboxCommandTimeout``, as a real backend would.
    """

    def __init__(
        self,
        handler: Callable[[Call], Any] | None = None,
        *,
        clock: FakeClock | None = None,
        takes_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.handler = handler or (lambda call: ExecResult(exit_code=0, stdout="", stderr=""))
        self.clock = clock
        self.takes_s = takes_s

    def answer(self, call: Call) -> Any:
        if self.clock is not None:
            if self.takes_s > call.timeout:
                self.clock.advance(call.timeout)
                raise SandboxCommandTimeout(
                    f"{call.command!r} ran past {call.timeout} s",
                    command=call.command,
                    timeout_s=call.timeout,
                )
            self.clock.advance(self.takes_s)
        return self.handler(call)

    async def write_file(self, path: str, data: bytes) -> None:
        raise SandboxGone("the fake sandbox has no files")

    async def read_file(self, path: str) -> bytes:
        raise SandboxGone("the fake sandbox has no files")

    async def list_files(self, path: str):
        raise SandboxGone("the fake sandbox has no files")


@pytest.fixture
def fake_sandbox() -> type[FakeSandbox]:
    return FakeSandbox


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
