"""The rllm-core sandbox conformance suite against ModalBackend over the fake modal module."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from rllm_core.testing.suites.sandboxes import SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_modal.backend import ModalBackend
from rllm_sandbox_backend_modal.plugin import ModalConfig
from rllm_sandbox_backend_modal_tests_fake import FakeModal

OUTPUT_LIMIT = 64 * 1024
_CAN_SWITCH_USER = os.geteuid() == 0 and shutil.which("runuser") is not None


class TestModalOverFake(SandboxConformance):
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
