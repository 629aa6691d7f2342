"""The conformance suite against the real Modal service.

Runs only when ``MODAL_TOKEN_ID`` (and ``MODAL_TOKEN_SECRET``) are set; it creates a few small
sandboxes in the app ``rllm-conformance`` and terminates them, and every sandbox it made is
removed by tag afterwards even when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest
from rllm_core.testing.suites.sandboxes import SandboxConformance
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_modal.backend import ModalBackend
from rllm_sandbox_backend_modal.plugin import ModalConfig

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not os.environ.get("MODAL_TOKEN_ID"),
        reason="MODAL_TOKEN_ID is not set: the live Modal tests need Modal credentials",
    ),
]

RUN_ID = f"conformance-{secrets.token_hex(4)}"


class TestModalLive(SandboxConformance):
    output_limit_bytes = 1 << 20
    exec_user = "nobody"
    large_output_bytes = 5_000_000
    timeout_slack_s = 15.0
    deadline_s = 300.0

    @pytest.fixture
    def sandbox_backend(self):
        config = ModalConfig(app_name="rllm-conformance", run_id=RUN_ID)
        backend = ModalBackend(config)
        yield backend
        asyncio.run(backend.cleanup())

    @pytest.fixture
    def sandbox_spec(self):
        return SandboxSpec(image="debian:bookworm-slim", workdir="/workspace", lifetime_s=900)
