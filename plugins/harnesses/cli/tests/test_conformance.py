"""The cli harness against the harness conformance suite: the real gateway with a scripted
model, a small agent program (installed by the harness's install script) in the installed
local sandbox, isolated by bubblewrap where it works, in the harness's default network: the
sandbox reaches the gateway and nothing else.

The agent keeps the conversation, ends when a reply's last line is ``DONE``, stops after
three calls, and reports how it ended in the outcome file. A second agent reports nothing and
exits 1 when a model call fails: the harness then judges by the exit code alone. Hostile and
honest agents play the shipped task ``count-lines`` through the rollout, graded by its Harbor
verifier: the agent talks to the model once, through the gateway network, then runs its
command."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from reference.harness_task import ShippedShellTask
from reference.toy_renderer import ToyChatRenderer
from rllm_core.plugins import PluginManager
from rllm_core.ports import SandboxBackend
from rllm_core.testing.suites.harnesses import AgentRunning, HarnessConformance
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_core.types import SandboxSpec, Task, Termination
from rllm_harness_cli.harness import CliHarness
from rllm_harness_cli.plugin import CliConfig

AGENT = """\
import json, os, sys, urllib.error, urllib.request

MAX_TURNS = 3
report = "--report" in sys.argv
messages = [{"role": "user", "content": open(os.environ["RLLM_INSTRUCTION_PATH"]).read()}]


def end(termination, turns, answer=None, code=0):
    if report:
        outcome = {"termination": termination, "turns": turns, "answer": answer}
        open(os.environ["RLLM_OUTCOME_PATH"], "w").write(json.dumps(outcome))
    sys.exit(code)


def call():
    body = {"model": os.environ["OPENAI_MODEL"], "messages": messages}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["choices"][0]["message"]["content"]


turns = 0
while turns < MAX_TURNS:
    try:
        content = call()
    except (OSError, ValueError) as error:
        print(f"model call failed: {error}", file=sys.stderr)
        end("model_error", turns, code=1)
    turns += 1
    messages.append({"role": "assistant", "content": content})
    if content.strip().splitlines()[-1:] == ["DONE"]:
        end("done", turns, answer=content)
    messages.append({"role": "user", "content": "Go on."})
end("max_turns", turns)
"""

INSTALL = f"""\
set -e
cat > "$(dirname "$RLLM_OUTCOME_PATH")/agent.py" <<'PY'
{AGENT}PY
"""

END = "RLLM_AGENT_COMMAND_END"

NO_TURN_COUNT = (
    "without an outcome file the cli harness reports turns=0 whatever the number of model"
    " calls the agent made through the gateway"
)
NO_MODEL_ERROR = (
    "without an outcome file the cli harness reports DONE for any exit code other than 126"
    " and 127, so an agent whose model call failed (exit 1) ends DONE, not MODEL_ERROR"
)


def expected_failure(check: Callable[..., None], reason: str) -> Callable[..., None]:
    """The suite's ``check``, expected to fail an assertion for ``reason``. A new function: a
    mark on the suite's own would reach every harness's tests."""

    @functools.wraps(check)
    def test(*args: Any, **kwargs: Any) -> None:
        check(*args, **kwargs)

    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)(test)


# The agent needs only the standard library: the base interpreter, which a bubblewrap
# sandbox sees through a read-only bind of its prefix.
PYTHON = os.path.realpath(os.path.join(sys.base_prefix, "bin", "python3"))


class TestCliHarness(ShippedShellTask, HarnessConformance):
    needs_sandbox = True
    max_turns = 3
    endless_reply = "Still working on it."
    report = True

    @pytest.fixture
    def sandbox_backend(self) -> Iterator[SandboxBackend]:
        spec = PluginManager(strict=False).get("sandbox_backend", "local")
        backend = spec.build({"isolation": "auto", "extra_ro_binds": [sys.base_prefix]})
        yield backend
        run_with_deadline(backend.close(), self.deadline_s)

    @pytest.fixture
    def graded_sandbox_backend(self) -> Iterator[SandboxBackend]:
        spec = PluginManager(strict=False).get("sandbox_backend", "local")
        backend = spec.build({"isolation": "bwrap", "extra_ro_binds": [sys.base_prefix]})
        yield backend
        run_with_deadline(backend.close(), self.deadline_s)

    @pytest.fixture
    def agent_running(self) -> AgentRunning:
        def running(command: str) -> tuple[CliHarness, list[str]]:
            install = f'{INSTALL}cat > "$(dirname "$RLLM_OUTCOME_PATH")/command.sh" <<\'{END}\'\n'
            harness = CliHarness(
                CliConfig(
                    install=f"{install}{command.rstrip()}\n{END}\n",
                    invocation=f"{PYTHON} {{agent_dir}}/agent.py --report"
                    " && bash {agent_dir}/command.sh",
                    install_timeout_s=20.0,
                    timeout_cap_s=20.0,
                )
            )
            return harness, ["DONE"]

        return running

    @pytest.fixture
    def harness(self, tmp_path) -> CliHarness:
        report = " --report" if self.report else ""
        return CliHarness(
            CliConfig(
                install=INSTALL,
                invocation=f"{PYTHON} {{agent_dir}}/agent.py{report}",
                agent_dir=str(tmp_path / "work" / ".agent"),
                install_timeout_s=20.0,
                timeout_cap_s=20.0,
            )
        )

    @pytest.fixture
    def harness_task(self, tmp_path) -> Task:
        return Task(
            task_id="say-hi",
            instruction="Say hi, then say DONE.",
            environment=SandboxSpec(workdir=str(tmp_path / "work")),
        )

    @pytest.fixture
    def harness_script(self) -> list[str]:
        return ["Hi.", "Hi again.\nDONE"]

    @pytest.fixture
    def gateway_renderer(self) -> ToyChatRenderer:
        return ToyChatRenderer()


class TestCliHarnessWithoutOutcomeFile(TestCliHarness):
    """The same agent when it writes no outcome file: the harness's own fallback. The agent
    stops at its limit with exit 0, which the harness reports as DONE."""

    report = False
    endless_termination = Termination.DONE

    @pytest.fixture
    def agent_running(self) -> AgentRunning:
        pytest.skip("the graded runs are TestCliHarness's: the agent's report plays no part")

    test_turns_equal_the_recorded_model_calls = expected_failure(
        HarnessConformance.test_turns_equal_the_recorded_model_calls, NO_TURN_COUNT
    )
    test_a_model_that_never_finishes_ends_at_the_limit = expected_failure(
        HarnessConformance.test_a_model_that_never_finishes_ends_at_the_limit, NO_TURN_COUNT
    )
    test_a_failing_model_ends_with_model_error = expected_failure(
        HarnessConformance.test_a_failing_model_ends_with_model_error, NO_MODEL_ERROR
    )
    test_an_unreachable_endpoint_ends_with_model_error = expected_failure(
        HarnessConformance.test_an_unreachable_endpoint_ends_with_model_error, NO_MODEL_ERROR
    )
