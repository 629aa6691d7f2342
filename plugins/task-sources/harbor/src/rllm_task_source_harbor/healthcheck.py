"""Running a task's ``[environment.healthcheck]`` before the agent starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, TaskSetupError
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Task

from rllm_task_source_harbor.output import output_tail

__all__ = ["run_healthcheck"]


async def run_healthcheck(
    task: Task,
    sandbox: Sandbox,
    check: Mapping[str, Any],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> int:
    """Run ``check["command"]`` in ``sandbox`` until it exits 0; return the tries it took.

    ``check`` is ``task.data["healthcheck"]``. Each try runs as the sandbox's default user in
    the workdir and may take ``timeout_s``; after a failed one the next waits ``interval_s``
    (``start_interval_s`` while within ``start_period_s`` of the first try, where failures do
    not count). When more than ``retries`` counted tries have failed it raises
    ``TaskSetupError`` naming the task, the command, the tries, the last exit code (``None``
    for a timeout) and the tail of the last output: an infrastructure failure, since the
    environment never became ready and the agent never ran.
    """
    command = str(check["command"])
    timeout = float(check["timeout_s"])
    retries = int(check["retries"])
    start_period = float(check.get("start_period_s") or 0.0)
    started = clock()
    tries = failures = 0
    while True:
        tries += 1
        try:
            result = await sandbox.exec(command, timeout=timeout)
        except SandboxCommandTimeout:
            exit_code, tail, what = None, "", f"ran past its {timeout:g} s timeout"
        else:
            if result.exit_code == 0:
                return tries
            exit_code = result.exit_code
            tail = output_tail(result.stdout, result.stderr)
            what = f"exited {exit_code}"
        starting = clock() - started < start_period
        if not starting:
            failures += 1
        if failures > retries:
            raise TaskSetupError(
                f"task {task.task_id}: healthcheck {command[:200]!r} failed {tries}"
                f" time{'s' if tries > 1 else ''}; the last try {what}, so the environment is"
                " not ready and the agent was not started; fix [environment.healthcheck] in"
                f" task.toml or the environment it checks. Output:\n{tail or '(none)'}",
                task_id=task.task_id,
                command=command,
                exit_code=exit_code,
                output=tail,
            )
        await sleep(float(check["start_interval_s" if starting else "interval_s"]))
