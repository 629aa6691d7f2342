"""The sandbox conformance suite, with bubblewrap and in fallback mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rllm_core.testing.suites.sandboxes import SandboxConformance
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.bwrap import probe
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig

LIMIT = 1 << 20
BWRAP_PROBLEM = probe("bwrap")


@pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap is unusable here: {BWRAP_PROBLEM}"
)
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

    @pytest.fixture
    def sandbox_backend(self, tmp_path: Path) -> LocalBackend:
        return LocalBackend(
            LocalSandboxConfig(
                isolation="none", output_limit_bytes=LIMIT, root_dir=tmp_path / "roots"
            )
        )
