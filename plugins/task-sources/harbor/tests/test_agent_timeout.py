"""``[agent].timeout_sec`` caps the harness's time for the task: the task carries it, the
rollout runner cancels a harness that runs past it, and the bundled harnesses budget by it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from reference.rollout_stack import gateway_runner
from reference.toy_renderer import ToyChatRenderer
from rllm_core.plugins import PluginManager
from rllm_core.rollout import RolloutSettings
from rllm_core.types import HarnessOutcome, Task, Termination
from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.source import HarborTaskSource
from task_sandbox import RootedBackend, write_task

CAPPED = "[agent]\ntimeout_sec = 0.5\n[verifier]\ntimeout_sec = 20\n"


class Stuck:
    """Never finishes on its own; records the task's budget it was handed."""

    def __init__(self) -> None:
        self.budgets: list[float] = []

    async def run(self, task: Task, llm: Any, sandbox: Any) -> HarnessOutcome:
        self.budgets.append(task.agent_timeout_s)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_the_runner_stops_a_harness_at_the_tasks_agent_timeout(tmp_path):
    source = HarborTaskSource(HarborConfig(path=write_task(tmp_path / "t", "t", toml=CAPPED)))
    (task,) = source.tasks()
    assert task.agent_timeout_s == 0.5
    harness = Stuck()
    settings = RolloutSettings(
        group_size=1, max_concurrency=1, max_infra_retries=0, deadline_margin_s=0.25
    )

    async def main() -> Any:
        async with gateway_runner(
            renderer=ToyChatRenderer(),
            source=source,
            harness=harness,
            backend=RootedBackend(tmp_path / "sandboxes"),
            store=PluginManager().get("trace_store", "memory").build({}),
            settings=settings,
        ) as (runner, _):
            return await runner.run([task], step=0)

    began = time.monotonic()
    batch = asyncio.run(main())
    assert time.monotonic() - began < 10
    assert harness.budgets == [0.5]
    (episode,) = batch.groups[0]
    # A timeout is the policy's: the episode is graded (nothing was written, so reward 0).
    assert (episode.termination, episode.reward) == (Termination.TIMEOUT, 0.0)
    assert (
        "ran past its 0.75 s deadline (the task's agent timeout plus 0.25 s)"
        in (episode.metadata["harness"]["error"])
    )


def test_the_shell_harness_budgets_by_the_tasks_agent_timeout_under_its_own_cap(tmp_path):
    toml = "[agent]\ntimeout_sec = 42\n"
    source = HarborTaskSource(HarborConfig(path=write_task(tmp_path, "t", toml=toml)))
    (task,) = source.tasks()
    shell = PluginManager().get("harness", "shell")
    assert shell.build({}).time_budget(task) == 42.0
    assert shell.build({"timeout_cap_s": 600}).time_budget(task) == 42.0
    assert shell.build({"timeout_cap_s": 10}).time_budget(task) == 10.0
