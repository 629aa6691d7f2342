"""``[environment.healthcheck]``: how it is read, how it is tried, and what a failing one does
to a rollout (an infrastructure failure, retried, never trained on)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from reference.rollout_stack import gateway_runner
from reference.toy_renderer import ToyChatRenderer
from rllm_core.errors import SandboxCommandTimeout, TaskSetupError
from rllm_core.plugins import PluginManager
from rllm_core.rollout import RolloutSettings
from rllm_core.types import DEFAULT_MASK, ExecResult, HarnessOutcome, Task, Termination
from rllm_task_source_harbor.healthcheck import run_healthcheck
from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.reader import check_task, load_task
from rllm_task_source_harbor.source import HarborTaskSource
from task_sandbox import GOOD_TOML, RootedBackend, write_task

TASK = Task(task_id="t", instruction="")
CHECK = {
    "command": "probe",
    "timeout_s": 2.0,
    "interval_s": 1.0,
    "retries": 2,
    "start_period_s": 0.0,
    "start_interval_s": 0.25,
}


class Scripted:
    """Answers each exec with the next exit code (or raises a timeout for ``None``)."""

    def __init__(self, codes: list[int | None], clock: list[float]) -> None:
        self.codes = codes
        self.clock = clock
        self.commands: list[tuple[str, float]] = []

    async def exec(self, command, timeout, user=None, env=None, cwd=None) -> ExecResult:
        self.commands.append((command, timeout))
        self.clock[0] += 0.1
        code = self.codes.pop(0)
        if code is None:
            raise SandboxCommandTimeout(f"{command} timed out")
        return ExecResult(exit_code=code, stdout="checking\n", stderr=f"code {code}\n")


def attempt(codes: list[int | None], **check: Any) -> tuple[Any, list[float], Scripted]:
    clock = [0.0]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    sandbox = Scripted(codes, clock)
    result = asyncio.run(
        run_healthcheck(TASK, sandbox, {**CHECK, **check}, clock=lambda: clock[0], sleep=sleep)
    )
    return result, sleeps, sandbox


def test_a_check_that_passes_within_its_retries_returns_the_tries():
    tries, sleeps, sandbox = attempt([1, 1, 0])
    assert tries == 3
    assert sleeps == [1.0, 1.0]
    assert sandbox.commands == [("probe", 2.0)] * 3


def test_a_check_failing_past_its_retries_names_command_exit_and_output():
    with pytest.raises(TaskSetupError) as info:
        attempt([1, 1, 3, 0])
    error = info.value
    assert (error.command, error.exit_code, error.output) == ("probe", 3, "checking\ncode 3")
    message = str(error)
    assert message.startswith("task t: healthcheck 'probe' failed 3 times; the last try exited 3")
    assert message.endswith("Output:\nchecking\ncode 3")


def test_a_check_timing_out_fails_like_a_non_zero_exit():
    with pytest.raises(TaskSetupError, match="the last try ran past its 2 s timeout") as info:
        attempt([None], retries=0)
    assert info.value.exit_code is None


def test_failures_in_the_start_period_do_not_count():
    # Each try takes 0.1 s: two fail inside the 0.6 s start period (0.25 s apart), one counted
    # failure follows, then a pass.
    tries, sleeps, _ = attempt([1, 1, 1, 0], retries=1, start_period_s=0.6)
    assert tries == 4
    assert sleeps == [0.25, 0.25, 1.0]
    with pytest.raises(TaskSetupError, match="failed 4 times"):
        attempt([1, 1, 1, 1], retries=1, start_period_s=0.6)


# ---------------------------------------------------------------- reading task.toml

HEALTHY = GOOD_TOML + '[environment.healthcheck]\ncommand = "test -f /app/input.txt"\n'


def test_the_healthcheck_is_read_with_its_defaults_and_counted_in_the_lifetime(tmp_path):
    plain = load_task(write_task(tmp_path, "plain"))
    task = load_task(write_task(tmp_path, "t", toml=HEALTHY))
    assert plain.data["healthcheck"] is None
    assert task.data["healthcheck"] == {
        "command": "test -f /app/input.txt",
        "timeout_s": 30.0,
        "interval_s": 5.0,
        "retries": 3,
        "start_period_s": 0.0,
        "start_interval_s": 5.0,
    }
    # Four tries of 30 s with three 5 s pauses between them.
    assert task.environment.lifetime_s == plain.environment.lifetime_s + 4 * 30 + 3 * 5


def test_bad_healthcheck_settings_are_problems_named_by_field(tmp_path):
    toml = "[environment.healthcheck]\nretries = -1\ntimeout_sec = 'soon'\nperiod = 3\n"
    check = check_task(write_task(tmp_path, "t", toml=toml))
    assert [str(p) for p in check.problems] == [
        "t: [environment.healthcheck].timeout_sec: must be a number of seconds, got 'soon'",
        "t: [environment.healthcheck].retries: must be a whole number >= 0, got -1",
        "t: [environment.healthcheck].command: missing: the healthcheck needs a command that"
        " exits 0 when the environment is ready",
    ]
    assert check.warnings == ["t: [environment.healthcheck].period is not a known field; ignored"]


# ---------------------------------------------------------------- through the rollout runner


class Solver:
    """Writes the answer the task's verifier wants, so a prepared episode is rewarded 1."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, task: Task, llm: Any, sandbox: Any) -> HarnessOutcome:
        self.calls += 1
        await sandbox.exec("echo done > output.txt", timeout=10)
        return HarnessOutcome(termination=Termination.DONE)


def roll(tmp_path: Path, toml: str, *, retries: int) -> tuple[Any, Solver, RootedBackend]:
    source = HarborTaskSource(HarborConfig(path=write_task(tmp_path / "tasks", "t", toml=toml)))
    (task,) = source.tasks()
    backend = RootedBackend(tmp_path / "sandboxes")
    harness = Solver()

    async def main() -> Any:
        async with gateway_runner(
            renderer=ToyChatRenderer(),
            source=source,
            harness=harness,
            backend=backend,
            store=PluginManager().get("trace_store", "memory").build({}),
            settings=RolloutSettings(
                group_size=1,
                max_concurrency=1,
                max_infra_retries=retries,
                mask=DEFAULT_MASK - {Termination.NO_MODEL_CALL},  # the solver calls no model
            ),
        ) as (runner, _):
            return await runner.run([task], step=0)

    return asyncio.run(main()), harness, backend


def test_a_passing_healthcheck_lets_the_episode_run(tmp_path):
    toml = GOOD_TOML + (
        '[environment.healthcheck]\ncommand = "test -f input.txt"\ninterval_sec = 0.05\n'
    )
    batch, harness, backend = roll(tmp_path, toml, retries=1)
    assert batch.infra_failures == []
    (episode,) = batch.groups[0]
    assert (episode.reward, episode.termination) == (1.0, Termination.DONE)
    assert harness.calls == 1
    (sandbox,) = backend.created
    assert [c[0] for c in sandbox.calls][:3] == [
        "mkdir -p /app",
        "mkdir -p /app && cd /app && printf 'a\\nb\\n' > input.txt",
        "test -f input.txt",
    ]


def test_a_failing_healthcheck_is_an_infra_failure_retried_and_never_trained_on(tmp_path):
    toml = GOOD_TOML + (
        "[environment.healthcheck]\n"
        "command = \"echo 'service down' >&2; exit 7\"\n"
        "retries = 1\ninterval_sec = 0.05\n"
    )
    batch, harness, backend = roll(tmp_path, toml, retries=2)
    assert batch.groups == [[]]
    (failure,) = batch.infra_failures
    assert failure.termination is Termination.SANDBOX_ERROR
    assert failure.attempt == 2
    assert "healthcheck \"echo 'service down' >&2; exit 7\" failed 2 times" in failure.error
    assert "the last try exited 7" in failure.error
    assert failure.error.endswith("Output:\nservice down")
    assert harness.calls == 0
    # Three attempts, each a fresh sandbox that tried the check twice and was closed.
    assert len(backend.created) == 3
    for sandbox in backend.created:
        assert sum("service down" in c[0] for c in sandbox.calls) == 2
