"""The Terminus-2 harness against the harness conformance suite, in both reply formats: the
real gateway with a scripted model, harbor's agent in the side environment, its tmux session
in the installed local sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference.harness_task import MakeFileTask
from rllm_core.testing.suites.harnesses import HarnessConformance
from rllm_harness_terminus_2.harness import Terminus2Harness
from rllm_harness_terminus_2.plugin import Terminus2Config
from rllm_harness_terminus_2.testing import reply


class _Common(MakeFileTask, HarnessConformance):
    needs_sandbox = True
    max_turns = 3
    parser = "json"
    deadline_s = 60.0
    # A cancel waits for the driver's acknowledgement, then kills the episode's tmux server
    # and, with no other episode running, the driver: seconds, more on a loaded machine.
    cancel_deadline_s = 10.0

    @pytest.fixture
    def harness(self, side_python: Path) -> Terminus2Harness:
        # Not closed: the process's driver serves the next test too.
        return Terminus2Harness(
            Terminus2Config(parser=self.parser, max_turns=3, max_retries=0, request_timeout_s=20.0)
        )

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return [
            reply(self.parser, "echo made > made.txt"),
            reply(self.parser, complete=True),
            reply(self.parser, complete=True),
        ]


class TestJson(_Common):
    endless_reply = reply("json", "true")
    slow_reply = reply("json", "sleep 60", duration=60)


class TestXml(_Common):
    parser = "xml"
    endless_reply = reply("xml", "true")
    slow_reply = reply("xml", "sleep 60", duration=60)
