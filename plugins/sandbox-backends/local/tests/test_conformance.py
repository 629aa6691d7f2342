"""The sandbox conformance suite, with bubblewrap and in fallback mode."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from rllm_core.testing.suites.sandboxes import HOSTILE_AGENTS, SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig
from rllm_sandbox_backend_local.testing import bubblewrap_problem

LIMIT = 1 << 20
BWRAP_PROBLEM = bubblewrap_problem("run the conformance suite in bubblewrap")
# Hostile agents that leave a process in a session of its own.
_ESCAPES = ("rewrites-the-reward-in-the-background", "replaces-the-test-script")


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=BWRAP_PROBLEM or "")
class TestLocalSandboxBwrap(SandboxConformance):
    output_limit_bytes = LIMIT
    exec_user = "nobody"

    @pytest.fixture
    def sandbox_backend(self, tmp_path: Path) -> LocalBackend:
        return LocalBackend(
            LocalSandboxConfig(
                isolation="bwrap", output_limit_bytes=LIMIT, root_dir=tmp_path / "roots"
            )
        )


class TestLocalSandboxFallback(SandboxConformance):
    output_limit_bytes = LIMIT
    # Without namespaces only root can switch users.
    exec_user = "nobody" if os.geteuid() == 0 else None

    def verifier_root(self, spec: SandboxSpec) -> str:
        return posixpath.join(spec.workdir, "root")

    @pytest.mark.parametrize("agent", sorted(HOSTILE_AGENTS))
    def test_a_hostile_agent_cannot_forge_the_reward(
        self, sandbox_backend: LocalBackend, sandbox_spec: SandboxSpec, agent: str
    ) -> None:
        if agent in _ESCAPES:
            pytest.skip(
                "without isolation a process that starts its own session cannot be told from"
                " the host's, so end_processes misses it (see the README); played here, it"
                " would outlive the test"
            )
        super().test_a_hostile_agent_cannot_forge_the_reward(sandbox_backend, sandbox_spec, agent)

    @pytest.fixture
    def sandbox_backend(self, tmp_path: Path) -> LocalBackend:
        return LocalBackend(
            LocalSandboxConfig(
                isolation="none", output_limit_bytes=LIMIT, root_dir=tmp_path / "roots"
            )
        )
