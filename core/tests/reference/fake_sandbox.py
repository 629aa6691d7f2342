"""The part of a scripted fake sandbox every harness test shares: the recorded calls, the
answer to each ``exec`` (an :class:`~rllm_core.types.ExecResult`, an exception to raise, or
``None`` for exit 0 with no output), and a lifecycle that is always alive and closes on
``async with`` exit. A subclass says how a call is answered and what its files do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rllm_core.kit.sandboxes import ClosesOnExit
from rllm_core.types import ExecResult

__all__ = ["Call", "ScriptedSandbox"]


@dataclass
class Call:
    command: str
    timeout: float
    user: str | None
    env: Mapping[str, str] | None
    cwd: str | None


class ScriptedSandbox(ClosesOnExit):
    """Records every ``exec`` in ``calls`` and answers it with :meth:`answer`."""

    merges_output = False
    gateway_url: str | None = None

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def answer(self, call: Call) -> Any:
        raise NotImplementedError

    async def exec(self, command, timeout, user=None, env=None, cwd=None) -> ExecResult:
        call = Call(command, timeout, user, dict(env) if env is not None else None, cwd)
        self.calls.append(call)
        answer = self.answer(call)
        if isinstance(answer, BaseException):
            raise answer
        return answer or ExecResult(exit_code=0, stdout="", stderr="")

    async def is_alive(self) -> bool:
        return True

    async def close(self) -> None:
        return None
