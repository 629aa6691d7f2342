"""The shell harness loop against the real gateway: what it sends, what it runs, and every way
an episode ends. Commands run in a fake sandbox (scripted results, fake clock) or in the
reference subprocess sandbox."""

from __future__ import annotations

import asyncio

import pytest
from reference.subprocess_sandbox import SubprocessBackend
from rllm_core.errors import SandboxError, SandboxGone
from rllm_core.types import ExecResult, SandboxSpec, Task, Termination
from rllm_harness_shell.harness import ShellHarness
from rllm_harness_shell.plugin import ShellConfig

TASK = Task(task_id="t1", instruction="Create hello.txt.", agent_timeout_s=600.0)


def harness(clock=None, **keys) -> ShellHarness:
    keys.setdefault("max_retries", 0)
    keys.setdefault("request_timeout_s", 30.0)
    config = ShellConfig(**keys)
    return ShellHarness(config) if clock is None else ShellHarness(config, clock=clock)


def cmd(command: str) -> str:
    return f"I will run this.\n```bash\n{command}\n```"


def run(shell: ShellHarness, endpoint, sandbox, task: Task = TASK):
    return asyncio.run(shell.run(task, endpoint, sandbox))


def ok(stdout: str = "", stderr: str = "", code: int = 0, truncated: bool = False):
    return ExecResult(exit_code=code, stdout=stdout, stderr=stderr, truncated=truncated)


def prompt_text(toy, sampler, n: int) -> str:
    return toy.decode(sampler.requests[n].prompt_token_ids)


def test_an_episode_in_a_real_subprocess_sandbox_records_one_trace_per_turn(
    gateway, store, toy, tmp_path
):
    server, sampler = gateway([cmd("echo hello > hello.txt && cat hello.txt"), "DONE"])

    async def episode():
        backend = SubprocessBackend()
        sandbox = await backend.create(SandboxSpec(workdir=str(tmp_path / "w")))
        try:
            return await harness().run(TASK, server.endpoint("ep"), sandbox)
        finally:
            await backend.close()

    outcome = asyncio.run(episode())

    assert outcome.termination is Termination.DONE
    assert outcome.turns == 2
    assert (tmp_path / "w" / "hello.txt").read_text() == "hello\n"
    [command] = outcome.metadata["commands"]
    assert command["command"] == "echo hello > hello.txt && cat hello.txt"
    assert (command["exit_code"], command["timed_out"], command["cut_chars"]) == (0, False, 0)
    assert (command["output_chars"], command["sandbox_truncated"]) == (6, False)
    assert prompt_text(toy, sampler, 1).endswith(
        "<|im_start|>user\nExit code: 0\nOutput:\nhello\n<|im_end|>\n<|im_start|>assistant\n"
    )
    chain = store.chain("ep")
    assert [r.turn for r in chain] == [0, 1]
    assert chain[1].parent_trace_id == chain[0].trace_id
    assert all(t.chain_complete for t in store.session("ep"))


def test_the_first_request_holds_the_system_prompt_and_the_instruction(gateway, toy, fake_sandbox):
    server, sampler = gateway(["FINISHED"])
    task = Task(
        task_id="t9",
        instruction="Sort names.txt.",
        environment=SandboxSpec(workdir="/app", user="agent"),
    )
    shell = harness(
        system_prompt="Work in {workdir}; finish with {done_marker}; {max_turns} turns.",
        instruction_template="[{task_id}] {instruction}",
        done_marker="FINISHED",
        max_turns=5,
    )
    outcome = run(shell, server.endpoint("s"), fake_sandbox(), task)

    assert prompt_text(toy, sampler, 0) == (
        "<|im_start|>system\nWork in /app; finish with FINISHED; 5 turns.<|im_end|>\n"
        "<|im_start|>user\n[t9] Sort names.txt.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 1)


def test_the_default_system_prompt_names_the_workdir_marker_and_timeout(gateway, toy, fake_sandbox):
    server, sampler = gateway(["DONE"])
    task = Task(task_id="t", instruction="x", environment=SandboxSpec(workdir="/srv/job"))
    outcome = run(harness(command_timeout_s=45), server.endpoint("s"), fake_sandbox(), task)

    system = prompt_text(toy, sampler, 0)
    assert "fresh bash shell in /srv/job," in system
    assert "stopped after 45 seconds" in system
    assert "a line that contains only DONE, without a code block" in system
    assert "```bash\nls -la\n```" in system
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 1)


def test_commands_run_in_the_workdir_as_the_agent_user_through_bash(gateway, fake_sandbox):
    server, _ = gateway([cmd("echo 'it''s' | wc -c"), "DONE"])
    sandbox = fake_sandbox()
    task = Task(
        task_id="t",
        instruction="x",
        environment=SandboxSpec(workdir="/app", user="agent"),
        agent_timeout_s=600,
    )
    run(harness(command_timeout_s=30), server.endpoint("s"), sandbox, task)

    [call] = sandbox.calls
    assert call.command == "bash -c 'echo '\"'\"'it'\"'\"''\"'\"'s'\"'\"' | wc -c'"
    assert (call.timeout, call.cwd, call.user, call.env) == (30, "/app", "agent", None)


def test_without_a_shell_the_command_is_handed_over_as_written(gateway, fake_sandbox):
    server, _ = gateway([cmd("ls | head -1"), "DONE"])
    sandbox = fake_sandbox()
    run(harness(shell=None), server.endpoint("s"), sandbox)
    assert sandbox.calls[0].command == "ls | head -1"
    assert (sandbox.calls[0].cwd, sandbox.calls[0].user) == (None, None)


def test_exit_code_stdout_and_stderr_come_back_as_the_next_user_message(gateway, toy, fake_sandbox):
    server, sampler = gateway([cmd("make"), cmd("true"), "DONE"])
    results = iter([ok("built\n", "warning: x\n", code=2), ok()])
    run(harness(), server.endpoint("s"), fake_sandbox(lambda call: next(results)))

    assert prompt_text(toy, sampler, 1).endswith(
        "<|im_start|>user\nExit code: 2\nOutput:\nbuilt\nwarning: x\n<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt_text(toy, sampler, 2).endswith(
        "<|im_start|>user\nExit code: 0\nOutput:\n(no output)<|im_end|>\n<|im_start|>assistant\n"
    )


def test_long_output_is_cut_in_the_middle_and_recorded(gateway, toy, fake_sandbox):
    server, sampler = gateway([cmd("seq"), "DONE"])
    sandbox = fake_sandbox(lambda call: ok("0123456789" * 3, truncated=True))
    outcome = run(
        harness(max_output_chars=10, observation_template="{output}"), server.endpoint("s"), sandbox
    )

    assert prompt_text(toy, sampler, 1).endswith(
        "<|im_start|>user\n01234\n[... 20 characters cut ...]\n56789<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    [command] = outcome.metadata["commands"]
    assert (command["output_chars"], command["cut_chars"], command["sandbox_truncated"]) == (
        30,
        20,
        True,
    )


def test_a_reply_without_a_command_gets_the_reminder_and_counts_as_a_turn(
    gateway, toy, fake_sandbox
):
    server, sampler = gateway(["Let me think about it.", cmd("ls"), "DONE"])
    outcome = run(
        harness(format_reminder="One command please, or {done_marker}."),
        server.endpoint("s"),
        fake_sandbox(),
    )

    assert (outcome.termination, outcome.turns) == (Termination.DONE, 3)
    assert outcome.metadata["format_reminders"] == 1
    assert len(outcome.metadata["commands"]) == 1
    assert prompt_text(toy, sampler, 1).endswith(
        "<|im_start|>user\nOne command please, or DONE.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_command_with_the_marker_runs_and_then_the_episode_ends(gateway, fake_sandbox):
    server, sampler = gateway([cmd("touch done.flag") + "\nDONE"])
    sandbox = fake_sandbox()
    outcome = run(harness(), server.endpoint("s"), sandbox)
    assert (outcome.termination, outcome.turns, sampler.calls) == (Termination.DONE, 1, 1)
    assert sandbox.calls[0].command == "bash -c 'touch done.flag'"


def test_max_turns_ends_the_episode(gateway, fake_sandbox, store):
    server, sampler = gateway(lambda request: cmd("ls"))
    outcome = run(harness(max_turns=3), server.endpoint("s"), fake_sandbox())
    assert (outcome.termination, outcome.turns, sampler.calls) == (Termination.MAX_TURNS, 3, 3)
    assert [r.turn for r in store.chain("s")] == [0, 1, 2]


def test_every_reply_empty_is_a_model_error(gateway, fake_sandbox):
    server, _ = gateway(["", " ", ""])
    outcome = run(harness(max_turns=3), server.endpoint("s"), fake_sandbox())
    assert (outcome.termination, outcome.turns) == (Termination.MODEL_ERROR, 3)
    assert outcome.metadata["empty_replies"] == 3
    assert outcome.metadata["error"] == "all 3 replies were empty"


def test_some_empty_replies_are_not_a_model_error(gateway, fake_sandbox):
    server, _ = gateway(["", cmd("ls")])
    outcome = run(harness(max_turns=2), server.endpoint("s"), fake_sandbox())
    assert outcome.termination is Termination.MAX_TURNS
    assert outcome.metadata["empty_replies"] == 1


def test_a_prompt_grown_past_the_gateway_limit_is_context_length(gateway, fake_sandbox):
    server, sampler = gateway([cmd("cat big"), "never"], max_prompt_tokens=120)
    sandbox = fake_sandbox(lambda call: ok("x" * 200))
    outcome = run(harness(system_prompt=None), server.endpoint("s"), sandbox)

    assert outcome.termination is Termination.CONTEXT_LENGTH
    assert outcome.turns == 1
    assert (outcome.metadata["status"], outcome.metadata["code"]) == (400, "prompt_too_long")
    assert sampler.calls == 1


def test_a_failing_model_call_is_a_model_error(gateway, fake_sandbox):
    server, _ = gateway([cmd("ls"), RuntimeError("engine crashed")])
    outcome = run(harness(), server.endpoint("s"), fake_sandbox())
    assert (outcome.termination, outcome.turns) == (Termination.MODEL_ERROR, 1)
    assert (outcome.metadata["status"], outcome.metadata["error_type"]) == (
        500,
        "InternalServerError",
    )
    assert len(outcome.metadata["commands"]) == 1


@pytest.mark.parametrize(
    "error",
    [SandboxGone("sandbox sb-1 was reclaimed"), SandboxError("could not start bash")],
    ids=["gone", "failed"],
)
def test_a_sandbox_failure_is_a_sandbox_error_with_the_error_kept(gateway, fake_sandbox, error):
    server, sampler = gateway([cmd("ls"), "never"])
    outcome = run(harness(), server.endpoint("s"), fake_sandbox(lambda call: error))

    assert (outcome.termination, outcome.turns, sampler.calls) == (Termination.SANDBOX_ERROR, 1, 1)
    assert outcome.metadata["error"] == str(error)
    assert outcome.metadata["error_type"] == type(error).__name__
    [command] = outcome.metadata["commands"]
    assert (command["exit_code"], command["timed_out"]) == (None, False)


def test_a_command_past_its_own_timeout_is_reported_and_the_episode_goes_on(
    gateway, toy, fake_sandbox, fake_clock
):
    server, sampler = gateway([cmd("sleep 100"), "DONE"])
    sandbox = fake_sandbox(clock=fake_clock, takes_s=100)
    outcome = run(harness(fake_clock, command_timeout_s=2.5), server.endpoint("s"), sandbox)

    assert (outcome.termination, outcome.turns) == (Termination.DONE, 2)
    assert prompt_text(toy, sampler, 1).endswith(
        "<|im_start|>user\nThe command ran past 2.5 seconds and was killed.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    [command] = outcome.metadata["commands"]
    assert (command["exit_code"], command["timed_out"], command["duration_s"]) == (None, True, 2.5)


def test_the_time_budget_shortens_the_last_command_and_ends_the_episode(
    gateway, fake_sandbox, fake_clock
):
    server, sampler = gateway(lambda request: cmd("work"))
    sandbox = fake_sandbox(clock=fake_clock, takes_s=40)
    task = Task(task_id="t", instruction="x", agent_timeout_s=100)
    outcome = run(harness(fake_clock, command_timeout_s=60), server.endpoint("s"), sandbox, task)

    assert outcome.termination is Termination.TIMEOUT
    assert [call.timeout for call in sandbox.calls] == [60, 60, 20]
    assert (outcome.turns, sampler.calls) == (3, 3)
    assert (outcome.metadata["time_budget_s"], outcome.metadata["elapsed_s"]) == (100, 100)
    assert [c["timed_out"] for c in outcome.metadata["commands"]] == [False, False, True]


def test_the_cap_bounds_the_budget_and_no_model_call_starts_after_it(
    gateway, fake_sandbox, fake_clock
):
    server, sampler = gateway(lambda request: cmd("work"))
    sandbox = fake_sandbox(clock=fake_clock, takes_s=10)
    task = Task(task_id="t", instruction="x", agent_timeout_s=1000)
    shell = harness(fake_clock, command_timeout_s=60, timeout_cap_s=50)
    outcome = run(shell, server.endpoint("s"), sandbox, task)

    assert shell.time_budget(task) == 50
    assert outcome.termination is Termination.TIMEOUT
    assert [call.timeout for call in sandbox.calls] == [50, 40, 30, 20, 10]
    assert (outcome.turns, sampler.calls) == (5, 5)


def test_a_cap_above_the_task_timeout_leaves_the_task_timeout():
    assert (
        harness(timeout_cap_s=900).time_budget(
            Task(task_id="t", instruction="x", agent_timeout_s=120)
        )
        == 120
    )


def test_a_model_call_running_past_the_budget_is_a_timeout(gateway, fake_sandbox):
    server, _ = gateway(["DONE"], delay_s=1.5)
    task = Task(task_id="t", instruction="x", agent_timeout_s=0.3)
    outcome = run(harness(), server.endpoint("s"), fake_sandbox(), task)

    assert (outcome.termination, outcome.turns) == (Termination.TIMEOUT, 0)
    assert outcome.metadata["elapsed_s"] < 1.5


def test_every_reply_empty_until_the_budget_is_a_model_error(gateway, fake_sandbox, fake_clock):
    def empty(request):
        fake_clock.advance(30)
        return ""

    server, _ = gateway(empty)
    task = Task(task_id="t", instruction="x", agent_timeout_s=60)
    outcome = run(harness(fake_clock), server.endpoint("s"), fake_sandbox(), task)
    assert (outcome.termination, outcome.turns) == (Termination.MODEL_ERROR, 2)


def test_no_sandbox_is_a_usage_error(gateway):
    server, _ = gateway(["DONE"])
    with pytest.raises(ValueError, match="needs a sandbox for task 't1'"):
        run(harness(), server.endpoint("s"), None)
