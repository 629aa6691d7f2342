"""The task and renderer of the conformance tests of harnesses that act in a sandbox folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.types import SandboxSpec, Task


class MakeFileTask:
    """Mixed into a :class:`~rllm_core.testing.suites.harnesses.HarnessConformance` subclass:
    its ``harness_task`` asks for ``made.txt`` in a fresh ``work`` folder, and its gateway
    renders with the toy renderer. The subclass's script writes that file."""

    @pytest.fixture
    def harness_task(self, tmp_path: Path) -> Task:
        return Task(
            task_id="make-file",
            instruction="Create made.txt.",
            environment=SandboxSpec(workdir=str(tmp_path / "work")),
        )

    @pytest.fixture
    def gateway_renderer(self) -> ToyChatRenderer:
        return ToyChatRenderer()
