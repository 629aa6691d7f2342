"""Preparing a fresh sandbox for a task: its workdir and the replayed Dockerfile steps."""

from __future__ import annotations

import shlex
import time

from rllm_core.errors import SandboxCommandTimeout, SandboxError, TaskSetupError
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Task

from rllm_task_source_harbor.output import output_tail
from rllm_task_source_harbor.task_toml import DEFAULT_BUILD_TIMEOUT_S

__all__ = ["prepare_sandbox"]

_MKDIR_TIMEOUT_S = 60.0


async def prepare_sandbox(task: Task, sandbox: Sandbox) -> None:
    """Make ``sandbox`` ready for ``task``; call once after creating it, before the harness.

    Creates the task's workdir, then runs ``task.data["setup_commands"]`` in order (the
    replayed ``RUN`` steps; each enters its own ``WORKDIR``) as the sandbox's default user,
    all within ``task.data["build_timeout_s"]``. A step that exits non-zero or runs out of
    time raises ``TaskSetupError`` naming the task, the step and the tail of its output.
    """
    spec = task.environment
    if spec is not None and spec.workdir:
        result = await sandbox.exec(
            f"mkdir -p {shlex.quote(spec.workdir)}", timeout=_MKDIR_TIMEOUT_S, cwd="/"
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"task {task.task_id}: could not create workdir {spec.workdir}"
                f" (exit {result.exit_code}): {output_tail(result.stdout, result.stderr)}"
            )
    commands = list(task.data.get("setup_commands") or [])
    budget = float(task.data.get("build_timeout_s") or DEFAULT_BUILD_TIMEOUT_S)
    deadline = time.monotonic() + budget
    for index, command in enumerate(commands, start=1):
        step = f"setup step {index}/{len(commands)}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TaskSetupError(
                f"task {task.task_id}: the {budget:g} s build timeout ran out before {step};"
                " raise [environment].build_timeout_sec",
                task_id=task.task_id,
                command=command,
                exit_code=None,
                output="",
            )
        try:
            result = await sandbox.exec(command, timeout=remaining)
        except SandboxCommandTimeout as exc:
            raise TaskSetupError(
                f"task {task.task_id}: {step} ran past the {budget:g} s build timeout:"
                f" {command[:200]!r}; raise [environment].build_timeout_sec",
                task_id=task.task_id,
                command=command,
                exit_code=None,
                output="",
            ) from exc
        if result.exit_code != 0:
            tail = output_tail(result.stdout, result.stderr)
            raise TaskSetupError(
                f"task {task.task_id}: {step} exited {result.exit_code}: {command[:200]!r};"
                f" fix that RUN step of environment/Dockerfile or turn replay_dockerfile off."
                f" Output:\n{tail}",
                task_id=task.task_id,
                command=command,
                exit_code=result.exit_code,
                output=tail,
            )
