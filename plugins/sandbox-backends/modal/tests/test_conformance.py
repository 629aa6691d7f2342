"""The rllm-core sandbox conformance suite against ModalBackend over the fake modal module."""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from typing import Any

import pytest
from rllm_core.testing.suites.sandboxes import HOSTILE_AGENTS, SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_modal.backend import ModalBackend
from rllm_sandbox_backend_modal.plugin import ModalConfig
from rllm_sandbox_backend_modal_tests_fake import FakeModal

OUTPUT_LIMIT = 64 * 1024
_CAN_SWITCH_USER = os.geteuid() == 0 and shutil.which("runuser") is not None


_NO_PROCESS_END = (
    "the modal backend does not implement EndsProcesses: a sweep of the sandbox's processes"
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


class TestModalOverFake(_NoProcessEnd):
    output_limit_bytes = OUTPUT_LIMIT
    # Switching users needs root; as root the suite checks `nobody`.
    exec_user = "nobody" if _CAN_SWITCH_USER else None

    @pytest.fixture
    def sandbox_backend(self):
        config = ModalConfig(output_limit_bytes=OUTPUT_LIMIT, create_interval_s=0.0)
        return ModalBackend(config, client=FakeModal())

    @pytest.fixture
    def sandbox_spec(self, tmp_path):
        if not _CAN_SWITCH_USER:
            yield SandboxSpec(workdir=str(tmp_path / "workdir"))
            return
        # pytest's tmp_path is private to root; `nobody` must be able to enter the workdir.
        parent = tempfile.mkdtemp(prefix="rllm-modal-conf-")
        os.chmod(parent, 0o755)
        yield SandboxSpec(workdir=os.path.join(parent, "workdir"))
        shutil.rmtree(parent, ignore_errors=True)
