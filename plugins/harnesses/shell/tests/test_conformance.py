"""The shell harness against the harness conformance suite: the real gateway with a scripted
model, commands in the installed local sandbox; hostile and honest agents are replies that
run their command on the shipped task ``count-lines``, graded by its Harbor verifier."""

from __future__ import annotations

import pytest
from reference.harness_task import MakeFileTask, ShippedShellTask
from rllm_core.testing.suites.harnesses import AgentRunning, HarnessConformance
from rllm_harness_shell.harness import ShellHarness
from rllm_harness_shell.plugin import ShellConfig


class TestShellHarness(MakeFileTask, ShippedShellTask, HarnessConformance):
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

    @pytest.fixture
    def agent_running(self) -> AgentRunning:
        def running(command: str) -> tuple[ShellHarness, list[str]]:
            harness = ShellHarness(ShellConfig(max_turns=3, max_retries=0, max_tokens=4096))
            return harness, [f"```bash\n{command.rstrip()}\n```", "DONE"]

        return running
