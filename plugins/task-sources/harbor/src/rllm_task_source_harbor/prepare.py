"""Preparing a fresh sandbox for a task: its workdir, the replayed Dockerfile steps and the
healthcheck."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, SandboxError, TaskSetupError, TaskSetupTimeout
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Task

from rllm_task_source_harbor.context import copy_context_files
from rllm_task_source_harbor.dockerfile import CopyStep
from rllm_task_source_harbor.healthcheck import run_healthcheck
from rllm_task_source_harbor.output import output_tail
from rllm_task_source_harbor.task_toml import DEFAULT_BUILD_TIMEOUT_S

__all__ = ["prepare_sandbox"]

_MKDIR_TIMEOUT_S = 60.0


async def prepare_sandbox(task: Task, sandbox: Sandbox) -> None:
    """Make ``sandbox`` ready for ``task``; call once after creating it, before the harness.

    Creates the task's workdir, then replays ``task.data["setup_steps"]`` in order as the
    sandbox's default user, all within ``task.data["build_timeout_s"]``: a ``RUN`` step as a
    shell command (it enters its own ``WORKDIR``), a ``COPY``/``ADD`` step by writing the
    files of ``task.data["context_dir"]`` it names (see
    :func:`~rllm_task_source_harbor.context.copy_context_files`). A step that fails or runs
    out of time raises ``TaskSetupError`` (``TaskSetupTimeout`` when out of time) naming the
    task, the step and the tail of its output. Last, the task's healthcheck runs (see
    :func:`~rllm_task_source_harbor.healthcheck.run_healthcheck`); one that keeps failing
    raises ``TaskSetupError`` too.

    A task whose environment names no image was built from its Dockerfile by a backend that
    builds Dockerfiles (see :func:`~rllm_core.ports.sandboxes.task_for_backend`): its steps
    are in the image already and none is replayed.
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
    built = spec is not None and spec.image is None and spec.dockerfile is not None
    steps: list[dict[str, Any]] = [] if built else list(task.data.get("setup_steps") or [])
    budget = float(task.data.get("build_timeout_s") or DEFAULT_BUILD_TIMEOUT_S)
    deadline = time.monotonic() + budget
    for index, step in enumerate(steps, start=1):
        name = f"setup step {index}/{len(steps)}"
        command = step.get("run") or _copy_command(step)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TaskSetupTimeout(
                f"task {task.task_id}: the {budget:g} s build timeout ran out before {name};"
                " raise [environment].build_timeout_sec",
                task_id=task.task_id,
                command=command,
                exit_code=None,
                output="",
            )
        try:
            if "copy" in step:
                context = Path(str(task.data.get("context_dir") or ""))
                await copy_context_files(
                    task, sandbox, CopyStep.from_dict(step["copy"]), context, timeout=remaining
                )
                continue
            result = await sandbox.exec(command, timeout=remaining)
        except SandboxCommandTimeout as exc:
            raise TaskSetupTimeout(
                f"task {task.task_id}: {name} ran past the {budget:g} s build timeout:"
                f" {command[:200]!r}; raise [environment].build_timeout_sec",
                task_id=task.task_id,
                command=command,
                exit_code=None,
                output="",
            ) from exc
        if result.exit_code != 0:
            tail = output_tail(result.stdout, result.stderr)
            raise TaskSetupError(
                f"task {task.task_id}: {name} exited {result.exit_code}: {command[:200]!r};"
                f" fix that RUN step of environment/Dockerfile or turn replay_dockerfile off."
                f" Output:\n{tail}",
                task_id=task.task_id,
                command=command,
                exit_code=result.exit_code,
                output=tail,
            )
    healthcheck = task.data.get("healthcheck")
    if healthcheck:
        await run_healthcheck(task, sandbox, healthcheck)


def _copy_command(step: dict[str, Any]) -> str:
    copy = CopyStep.from_dict(step["copy"])
    return f"{copy.keyword} {' '.join(copy.sources)} {copy.dest}"
