"""The single-turn harness against the harness conformance suite: the real gateway with a
scripted model; the harness needs no sandbox."""

from __future__ import annotations

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.testing.suites.harnesses import HarnessConformance
from rllm_core.types import Task, Termination
from rllm_harness_single_turn.harness import SingleTurnHarness
from rllm_harness_single_turn.plugin import SingleTurnConfig


class TestSingleTurnHarness(HarnessConformance):
    # One call is the whole episode: whatever the model says ends it, as DONE.
    max_turns = 1
    endless_reply = "Let me think about it some more."
    endless_termination = Termination.DONE

    @pytest.fixture
    def harness(self) -> SingleTurnHarness:
        return SingleTurnHarness(SingleTurnConfig(max_retries=0, request_timeout_s=20.0))

    @pytest.fixture
    def harness_task(self) -> Task:
        return Task(task_id="add", instruction="What is 2+2?")

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return ["4"]

    @pytest.fixture
    def gateway_renderer(self) -> ToyChatRenderer:
        return ToyChatRenderer()
