"""Emulated remote latency: ``start_delay_s`` before create hands out a sandbox and
``exec_delay_s`` before every command, both awaited without using the CPU, none by default.

Elapsed times are checked against lower bounds only: a busy machine may always be slower.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig

START_S = 0.4
EXEC_S = 0.3


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every ``asyncio.sleep`` delay awaited during the test, in order."""
    seen: list[float] = []
    real = asyncio.sleep

    async def recording(delay: float, *args: object, **kwargs: object) -> object:
        seen.append(delay)
        return await real(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", recording)
    return seen


def _backend(tmp_path: Path, **keys: float) -> LocalBackend:
    return LocalBackend(LocalSandboxConfig(isolation="none", root_dir=tmp_path / "roots", **keys))


def test_create_and_every_exec_wait_their_delays(tmp_path: Path, sleeps: list[float]) -> None:
    backend = _backend(tmp_path, start_delay_s=START_S, exec_delay_s=EXEC_S)

    async def body() -> tuple[float, list[float]]:
        started = time.monotonic()
        sandbox = await backend.create(SandboxSpec(workdir=str(tmp_path / "work")))
        create_s = time.monotonic() - started
        exec_s = []
        for command in ("true", "echo hi"):
            started = time.monotonic()
            result = await sandbox.exec(command, timeout=30)
            exec_s.append(time.monotonic() - started)
            assert result.exit_code == 0
        await backend.close()
        return create_s, exec_s

    create_s, exec_s = run_with_deadline(body(), 60)
    assert create_s >= START_S * 0.9
    assert all(elapsed >= EXEC_S * 0.9 for elapsed in exec_s)
    assert sleeps == [START_S, EXEC_S, EXEC_S], "the delays are awaited, not slept in a thread"


def test_exec_delay_is_outside_the_command_timeout(tmp_path: Path) -> None:
    backend = _backend(tmp_path, exec_delay_s=EXEC_S)

    async def body() -> int:
        sandbox = await backend.create(SandboxSpec(workdir=str(tmp_path / "work")))
        result = await sandbox.exec("true", timeout=EXEC_S / 3)
        await backend.close()
        return result.exit_code

    assert run_with_deadline(body(), 60) == 0


def test_no_delay_by_default(tmp_path: Path, sleeps: list[float]) -> None:
    config = LocalSandboxConfig()
    assert (config.start_delay_s, config.exec_delay_s) == (0.0, 0.0)
    backend = _backend(tmp_path)

    async def body() -> None:
        sandbox = await backend.create(SandboxSpec(workdir=str(tmp_path / "work")))
        assert (await sandbox.exec("true", timeout=30)).exit_code == 0
        await backend.close()

    run_with_deadline(body(), 60)
    assert sleeps == []


@pytest.mark.parametrize("key", ["start_delay_s", "exec_delay_s"])
def test_negative_delays_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        LocalSandboxConfig.model_validate({key: -1.0})
