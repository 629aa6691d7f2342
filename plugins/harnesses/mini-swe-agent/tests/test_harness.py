"""The harness end to end: mini-swe-agent's own loop against the real gateway (a scripted fake
model over the toy renderer), its commands in the real local sandbox (plain subprocesses in a
folder), in both action formats."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.errors import SandboxGone, UpstreamError
from rllm_core.gateway.server import Gateway
from rllm_core.plugins import PluginManager
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import HarnessOutcome, SandboxSpec, Task, Termination
from rllm_harness_mini_swe_agent.testing import SUBMIT, text_action, tool_call


def build(**config: Any) -> Any:
    config.setdefault("max_retries", 0)
    return PluginManager(disabled=()).get("harness", "mini-swe-agent").build(config)


def play(
    harness: Any,
    server: Any,
    workdir: Path,
    *,
    session: str = "episode-1",
    agent_timeout_s: float = 60.0,
    wrap: Any = None,
) -> HarnessOutcome:
    """One episode of a task whose sandbox is a folder holding ``notes.txt``; ``wrap`` may
    replace the sandbox the harness gets."""
    workdir.mkdir(parents=True, exist_ok=True)
    task = Task(
        task_id="list-files",
        instruction="List the files, then submit.",
        environment=SandboxSpec(workdir=str(workdir)),
        agent_timeout_s=agent_timeout_s,
    )
    backend = (
        PluginManager(disabled=()).get("sandbox_backend", "local").build({"isolation": "none"})
    )

    async def episode() -> HarnessOutcome:
        try:
            sandbox = await backend.create(task.environment)
            await sandbox.write_file("notes.txt", b"hello\n")
            if wrap is not None:
                sandbox = wrap(sandbox)
            return await harness.run(task, server.endpoint(session), sandbox)
        finally:
            await backend.close()

    return asyncio.run(episode())


def test_tool_calls_list_files_then_submit(gateway, store, toy, tmp_path):
    script = [tool_call("ls", "Let me look around."), tool_call(SUBMIT)]
    server, sampler = gateway(script)
    outcome = play(build(model_class="toolcall"), server, tmp_path / "w")

    assert outcome.termination is Termination.DONE
    assert outcome.turns == 2 == sampler.calls
    assert outcome.metadata["model_class"] == "toolcall"
    assert outcome.metadata["exit_status"] == "Submitted"
    assert [c["command"] for c in outcome.metadata["commands"]] == ["ls", SUBMIT]
    assert [c["returncode"] for c in outcome.metadata["commands"]] == [0, 0]

    traces = store.session("episode-1")
    assert len(traces) == 2
    assert {t.record.lineage_id for t in traces} == {"main"}
    assert traces[1].record.parent_trace_id == traces[0].record.trace_id
    prompt = toy.decode(traces[1].prompt_token_ids)
    # The library's own prompts, its bash tool offered, and the listing as a tool result.
    assert "Please solve this issue: List the files, then submit." in prompt
    assert '"name": "bash"' in prompt
    assert "<|im_start|>tool\n" in prompt and "notes.txt" in prompt


def test_text_actions_list_files_then_submit(gateway, store, toy, tmp_path):
    script = [text_action("ls"), text_action(SUBMIT)]
    server, _ = gateway(script)
    outcome = play(build(model_class="textbased"), server, tmp_path / "w")

    assert (outcome.termination, outcome.turns) == (Termination.DONE, 2)
    assert outcome.metadata["model_class"] == "textbased"
    traces = store.session("episode-1")
    assert len(traces) == 2 and {t.record.lineage_id for t in traces} == {"main"}
    prompt = toy.decode(traces[1].prompt_token_ids)
    assert "mswea_bash_command" in prompt and "notes.txt" in prompt
    assert '"name": "bash"' not in prompt


class _Gone:
    """A sandbox whose command ``boom`` fails as if the sandbox had died."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)

    async def exec(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if command == "boom":
            raise SandboxGone("the sandbox was reclaimed")
        return await self.sandbox.exec(command, *args, **kwargs)


def test_the_step_limit_ends_with_max_turns(gateway, tmp_path):
    server, sampler = gateway(lambda request: tool_call("true"))
    outcome = play(build(model_class="toolcall", step_limit=3), server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.MAX_TURNS, 3)
    assert sampler.calls == 3
    assert outcome.metadata["exit_status"] == "LimitsExceeded"
    assert outcome.metadata["limit"] == "steps"


def test_repeated_bad_format_ends_with_format_error(gateway, store, tmp_path):
    server, _ = gateway(lambda request: "I would list the files.")
    outcome = play(build(model_class="textbased"), server, tmp_path / "w")
    # The library's default: three replies in a row without exactly one action.
    assert (outcome.termination, outcome.turns) == (Termination.FORMAT_ERROR, 3)
    assert outcome.metadata["format_errors"] == 3
    assert outcome.metadata["commands"] == []
    assert not outcome.termination.is_infrastructure
    assert len(store.session("episode-1")) == 3


def test_a_format_error_is_told_to_the_model_and_the_episode_goes_on(gateway, store, toy, tmp_path):
    script = ["no action here", tool_call("ls"), tool_call(SUBMIT)]
    server, _ = gateway(script)
    outcome = play(build(model_class="toolcall"), server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 3)
    assert outcome.metadata["format_errors"] == 1
    prompt = toy.decode(store.session("episode-1")[1].prompt_token_ids)
    assert "No tool calls found in the response" in prompt


def test_a_command_past_its_timeout_is_an_observation(gateway, store, toy, tmp_path):
    script = [tool_call("sleep 20"), tool_call(SUBMIT)]
    server, _ = gateway(script)
    outcome = play(build(model_class="toolcall", command_timeout_s=1), server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 2)
    first = outcome.metadata["commands"][0]
    assert (first["command"], first["returncode"], first["timed_out"]) == ("sleep 20", None, True)
    prompt = toy.decode(store.session("episode-1")[1].prompt_token_ids)
    assert "timed out after 1 seconds" in prompt and '"returncode": -1' in prompt


def test_the_time_budget_ends_with_timeout(gateway, tmp_path):
    server, _ = gateway([tool_call("sleep 30")])
    harness = build(model_class="toolcall", command_timeout_s=60, timeout_cap_s=1.5)
    began = time.monotonic()
    outcome = play(harness, server, tmp_path / "w")
    assert time.monotonic() - began < 10
    assert (outcome.termination, outcome.turns) == (Termination.TIMEOUT, 1)
    assert outcome.metadata["time_budget_s"] == 1.5


def test_a_failed_sandbox_ends_with_sandbox_error(gateway, tmp_path):
    server, _ = gateway([tool_call("boom")])
    outcome = play(build(model_class="toolcall"), server, tmp_path / "w", wrap=_Gone)
    assert (outcome.termination, outcome.turns) == (Termination.SANDBOX_ERROR, 1)
    assert outcome.metadata["error_type"] == "SandboxGone"
    assert outcome.termination.is_infrastructure


def test_a_failing_model_server_ends_with_model_error(gateway, tmp_path):
    server, _ = gateway([UpstreamError("the worker fell over")])
    outcome = play(build(model_class="toolcall"), server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.MODEL_ERROR, 0)
    assert outcome.metadata["status"] == 502


def test_an_over_long_prompt_ends_with_context_length(gateway, tmp_path):
    server, _ = gateway([tool_call("ls")], max_prompt_tokens=50)
    outcome = play(build(model_class="toolcall"), server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.CONTEXT_LENGTH, 0)
    assert outcome.metadata["status"] == 400


class _NoTools(ToyChatRenderer):
    """The toy template without a tool format: offered tools are refused, as the smollm2
    chatml template refuses them."""

    def render(self, messages, tools=None, add_generation_prompt=False):
        if tools:
            raise ValueError(
                f"this template has no tool format and cannot render {len(tools)} tools"
            )
        return super().render(messages, None, add_generation_prompt)


def test_auto_uses_tool_calls_when_the_gateway_renders_them(gateway, tmp_path):
    server, _ = gateway([tool_call(SUBMIT)])
    harness = build()
    outcome = play(harness, server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 1)
    assert outcome.metadata["model_class"] == harness.model_class == "toolcall"


def test_auto_falls_back_to_text_actions_when_the_gateway_refuses_tools(store, tmp_path):
    renderer = _NoTools()
    sampler = ScriptedSampler([text_action("ls"), text_action(SUBMIT)], renderer=renderer)
    harness = build()
    with Gateway(renderer=renderer, sampler=sampler, trace_store=store) as server:
        outcome = play(harness, server, tmp_path / "w")
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 2)
    assert outcome.metadata["model_class"] == harness.model_class == "textbased"
    assert outcome.metadata["tools_refused"] is True
    # One lineage: the refused request recorded nothing (the gateway had named a lineage for
    # its first message, so the text-based one is the session's second name).
    traces = store.session("episode-1")
    assert len(traces) == 2 and len({t.record.lineage_id for t in traces}) == 1
    assert traces[1].record.parent_trace_id == traces[0].record.trace_id
    assert "mswea_bash_command" in renderer.decode(traces[0].prompt_token_ids)


def test_cancelling_a_run_stops_the_command_in_flight(gateway, tmp_path):
    server, _ = gateway([tool_call("touch started && sleep 30 && touch late")])
    harness = build(model_class="toolcall", command_timeout_s=60)
    workdir = tmp_path / "w"
    workdir.mkdir()
    task = Task(task_id="t", instruction="wait", environment=SandboxSpec(workdir=str(workdir)))
    backend = (
        PluginManager(disabled=()).get("sandbox_backend", "local").build({"isolation": "none"})
    )

    async def episode() -> float:
        try:
            sandbox = await backend.create(task.environment)
            run = asyncio.ensure_future(harness.run(task, server.endpoint("episode-1"), sandbox))
            for _ in range(600):  # the first call imports the library: seconds
                if (workdir / "started").exists():
                    break
                await asyncio.sleep(0.05)
            assert (workdir / "started").exists(), "the command never started"
            run.cancel()
            began = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await run
            return time.monotonic() - began
        finally:
            await backend.close()

    assert asyncio.run(episode()) < 5
    assert not (workdir / "late").exists()
