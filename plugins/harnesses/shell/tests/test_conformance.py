"""The shell harness against the harness conformance suite: the real gateway with a scripted
model, commands in the installed local sandbox."""

from __future__ import annotations

import pytest
from reference.harness_task import MakeFileTask
from rllm_core.testing.suites.harnesses import HarnessConformance
from rllm_harness_shell.harness import ShellHarness
from rllm_harness_shell.plugin import ShellConfig


class TestShellHarness(MakeFileTask, HarnessConformance):
    needs_sandbox = True
    max_turns = 3
    endless_reply = "Checking.\n```bash\ntrue\n```"
    slow_reply = "Waiting.\n```bash\nsleep 60\n```"

    @pytest.fixture
    def harness(self) -> ShellHarness:
        return ShellHarness(ShellConfig(max_turns=3, max_retries=0, request_timeout_s=20.0))

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return ["I will create it.\n```bash\necho made > made.txt\n```", "DONE"]
