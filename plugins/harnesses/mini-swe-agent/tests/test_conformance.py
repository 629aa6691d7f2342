"""The mini-swe-agent harness against the harness conformance suite, in both action formats:
the real gateway with a scripted model, commands in the installed local sandbox."""

from __future__ import annotations

import pytest
from reference.harness_task import MakeFileTask
from rllm_core.testing.suites.harnesses import HarnessConformance
from rllm_harness_mini_swe_agent.harness import MiniSweAgentHarness
from rllm_harness_mini_swe_agent.plugin import MiniSweAgentConfig
from rllm_harness_mini_swe_agent.testing import SUBMIT, text_action, tool_call


class _Common(MakeFileTask, HarnessConformance):
    needs_sandbox = True
    max_turns = 3
    model_class = "toolcall"

    @pytest.fixture
    def harness(self) -> MiniSweAgentHarness:
        config = MiniSweAgentConfig(
            model_class=self.model_class, step_limit=3, max_retries=0, request_timeout_s=20.0
        )
        return MiniSweAgentHarness(config)


class TestToolcalls(_Common):
    endless_reply = tool_call("true", "Checking.")
    slow_reply = tool_call("sleep 60", "Waiting.")

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return [tool_call("echo made > made.txt", "I will create it."), tool_call(SUBMIT)]


class TestTextActions(_Common):
    model_class = "textbased"
    endless_reply = text_action("true")
    slow_reply = text_action("sleep 60")

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return [text_action("echo made > made.txt"), text_action(SUBMIT)]
