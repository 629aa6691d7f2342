"""The sandbox conformance suite, with bubblewrap and in fallback mode."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from rllm_core.testing.suites.sandboxes import SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig
from rllm_sandbox_backend_local.testing import bubblewrap_problem

LIMIT = 1 << 20
BWRAP_PROBLEM = bubblewrap_problem("run the conformance suite in bubblewrap")


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

    # Without isolation a process that starts its own session cannot be told from the
    # host's, so end_processes misses it (see the README).
    sessions_escape_end_processes = True

    def verifier_root(self, spec: SandboxSpec) -> str:
        return posixpath.join(spec.workdir, "root")

    @pytest.fixture
    def sandbox_backend(self, tmp_path: Path) -> LocalBackend:
        return LocalBackend(
            LocalSandboxConfig(
                isolation="none", output_limit_bytes=LIMIT, root_dir=tmp_path / "roots"
            )
        )
