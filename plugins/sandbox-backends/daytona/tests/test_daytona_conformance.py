"""The sandbox conformance suite against DaytonaBackend: over the fake client on both command
paths, and over real Daytona when ``DAYTONA_API_KEY`` is set."""

from __future__ import annotations

import os
from typing import ClassVar

import pytest
from fake_daytona import FakeDaytona, fast_config
from rllm_core.testing.suites.sandboxes import SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_daytona.backend import DaytonaBackend
from rllm_sandbox_backend_daytona.plugin import DaytonaSandboxConfig

LIMIT = 1 << 20
# The fake runs commands as local processes: switching to `nobody` needs root.
_SECOND_USER = "nobody" if os.geteuid() == 0 else None


class TestDaytonaOverFakeDirectExec(SandboxConformance):
    """Every command is one ``process.exec`` call (the threshold is above every timeout)."""

    output_limit_bytes = LIMIT
    exec_user = _SECOND_USER

    @pytest.fixture
    def sandbox_backend(self, fake_client: FakeDaytona) -> DaytonaBackend:
        config = fast_config(output_limit_bytes=LIMIT, session_threshold_s=1000.0)
        return DaytonaBackend(config, client=fake_client)

    def test_every_command_took_the_direct_path(
        self, sandbox_backend: DaytonaBackend, sandbox_spec: SandboxSpec, fake_client: FakeDaytona
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await self.exec_ok(sb, "echo hi", timeout=500)

        self.run_async(body())
        assert fake_client.calls_to("execute_session_command") == []
        assert len(fake_client.calls_to("exec")) == 2  # workdir setup, then the command


class TestDaytonaOverFakeSessions(SandboxConformance):
    """Every command with a timeout above 0.5 s is a polled session command."""

    output_limit_bytes = LIMIT
    exec_user = _SECOND_USER

    @pytest.fixture
    def sandbox_backend(self, fake_client: FakeDaytona) -> DaytonaBackend:
        config = fast_config(output_limit_bytes=LIMIT, session_threshold_s=0.5)
        return DaytonaBackend(config, client=fake_client)

    def test_commands_took_the_session_path(
        self, sandbox_backend: DaytonaBackend, sandbox_spec: SandboxSpec, fake_client: FakeDaytona
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                result = await self.exec_ok(sb, "sleep 0.3; echo late", timeout=5)
                assert result.stdout == "late\n"

        self.run_async(body())
        # Two commands (workdir setup, then the test's), each in its own session; the 0.3 s
        # one needs several polls 0.05 s apart.
        assert len(fake_client.calls_to("execute_session_command")) == 2
        assert len(fake_client.calls_to("create_session")) == 2
        assert len(fake_client.calls_to("delete_session")) == 2
        assert len(fake_client.calls_to("get_session_command")) >= 4
        assert fake_client.calls_to("exec") == []


@pytest.mark.live
class TestDaytonaLive(SandboxConformance):
    """The same suite against real Daytona; needs ``DAYTONA_API_KEY``."""

    output_limit_bytes = LIMIT
    large_output_bytes = 4 * LIMIT
    timeout_slack_s = 15.0
    deadline_s = 600.0
    exec_user: ClassVar[str | None] = None

    @pytest.fixture
    def sandbox_backend(self) -> DaytonaBackend:
        if not os.environ.get("DAYTONA_API_KEY"):
            pytest.skip("DAYTONA_API_KEY is not set: the live Daytona tests need an API key")
        return DaytonaBackend(
            DaytonaSandboxConfig(output_limit_bytes=LIMIT, session_threshold_s=10.0)
        )

    @pytest.fixture
    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec(workdir="/tmp/rllm-conformance", lifetime_s=900)
