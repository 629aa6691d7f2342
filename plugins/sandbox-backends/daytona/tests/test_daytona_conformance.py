"""The sandbox conformance suite against DaytonaBackend: over the fake client on both command
paths, and over real Daytona when ``DAYTONA_API_KEY`` is set."""

from __future__ import annotations

import asyncio
import os
import posixpath
from typing import Any, ClassVar

import pytest
from fake_daytona import FakeDaytona, fast_config
from rllm_core.testing.suites.sandboxes import HOSTILE_AGENTS, SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_daytona.backend import DaytonaBackend
from rllm_sandbox_backend_daytona.plugin import DaytonaSandboxConfig

LIMIT = 1 << 20
# The fake runs commands as local processes: switching to `nobody` needs root.
_SECOND_USER = "nobody" if os.geteuid() == 0 else None


_NO_PROCESS_END = (
    "the daytona backend does not implement EndsProcesses: a sweep of the sandbox's processes"
    " through exec is not written yet, so what an agent leaves running still runs while its"
    " verifier does (docs/security.md)"
)


class _NoProcessEnd(SandboxConformance):
    """The hostile-agent checks fail until the backend ends an agent's processes."""

    def verifier_root(self, spec: SandboxSpec) -> str:
        return posixpath.join(spec.workdir, "root")

    @pytest.mark.xfail(strict=True, raises=AssertionError, reason=_NO_PROCESS_END)
    @pytest.mark.parametrize("agent", sorted(HOSTILE_AGENTS))
    def test_a_hostile_agent_cannot_forge_the_reward(
        self, sandbox_backend: Any, sandbox_spec: SandboxSpec, agent: str
    ) -> None:
        super().test_a_hostile_agent_cannot_forge_the_reward(sandbox_backend, sandbox_spec, agent)

    @pytest.mark.xfail(strict=True, raises=AssertionError, reason=_NO_PROCESS_END)
    def test_an_honest_agent_is_rewarded_and_the_environment_survives(
        self, sandbox_backend: Any, sandbox_spec: SandboxSpec
    ) -> None:
        super().test_an_honest_agent_is_rewarded_and_the_environment_survives(
            sandbox_backend, sandbox_spec
        )


class TestDaytonaOverFakeDirectExec(_NoProcessEnd):
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


class TestDaytonaOverFakeSessions(_NoProcessEnd):
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
class TestDaytonaLive(_NoProcessEnd):
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


@pytest.mark.live
def test_live_daytona_builds_a_dockerfile_with_its_context(tmp_path) -> None:
    """Daytona builds a task's Dockerfile, copying a file of its build context into the
    image; needs ``DAYTONA_API_KEY``."""
    if not os.environ.get("DAYTONA_API_KEY"):
        pytest.skip("DAYTONA_API_KEY is not set: the live Daytona tests need an API key")
    context = tmp_path / "environment"
    context.mkdir()
    (context / "marker.txt").write_text("built from the context\n")
    dockerfile = "FROM alpine:3.20\nCOPY marker.txt /opt/marker.txt\n"
    (context / "Dockerfile").write_text(dockerfile)
    backend = DaytonaBackend(DaytonaSandboxConfig(output_limit_bytes=LIMIT))
    spec = SandboxSpec(
        dockerfile=dockerfile, context_dir=str(context), workdir="/tmp/w", lifetime_s=900
    )

    async def body() -> None:
        async with await backend.create(spec) as sb:
            result = await sb.exec("cat /opt/marker.txt", timeout=60)
            assert result.stdout == "built from the context\n"

    asyncio.run(asyncio.wait_for(body(), 900))
