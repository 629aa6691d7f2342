"""Replaying a ``COPY``/``ADD`` step: files of the build context written into the sandbox."""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from pathlib import Path

from rllm_core.errors import TaskSetupError
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Task

from rllm_task_source_harbor.dockerfile import CopyPlan, CopyStep
from rllm_task_source_harbor.output import output_tail

__all__ = ["copy_context_files"]


def _read(plan: CopyPlan) -> list[tuple[bytes, str, bool]]:
    """Each file's bytes, sandbox path and whether it is to be made executable."""
    executables = set(plan.executables)
    return [(host.read_bytes(), target, target in executables) for host, target in plan.files]


async def copy_context_files(
    task: Task, sandbox: Sandbox, step: CopyStep, context: Path, *, timeout: float
) -> int:
    """Write the files ``step`` copies from ``context`` into ``sandbox`` and return how many.

    The destination's directories are created (empty source folders included) and files a
    host user may execute are made executable; a single file copied to a destination
    without a trailing ``/`` lands inside it when that is a directory in the sandbox, as in
    Docker. Each command may take ``timeout`` seconds. Raises ``TaskSetupError`` when the
    plan cannot be made (the context changed since the task was read) or a command fails.
    """
    try:
        plan = await asyncio.to_thread(step.plan, context)
        files = await asyncio.to_thread(_read, plan)
    except (ValueError, OSError) as exc:
        raise _error(task, step, f"cannot be replayed: {exc}", exit_code=None, output="") from exc
    if plan.may_be_directory:
        probe = await sandbox.exec(f"test -d {shlex.quote(step.dest)}", timeout=timeout, cwd="/")
        if probe.exit_code == 0:
            ((data, _, executable),), ((host, _),) = files, plan.files
            files = [(data, posixpath.join(step.dest, host.name), executable)]
    if plan.directories:
        # A folder that is empty in the context still exists after a COPY.
        command = "mkdir -p " + " ".join(shlex.quote(d) for d in plan.directories)
        await _run(task, sandbox, step, command, timeout)
    for data, target, _ in files:
        await sandbox.write_file(target, data)
    executables = [target for _, target, executable in files if executable]
    if executables:
        command = "chmod +x " + " ".join(shlex.quote(path) for path in executables)
        await _run(task, sandbox, step, command, timeout)
    return len(files)


async def _run(task: Task, sandbox: Sandbox, step: CopyStep, command: str, timeout: float) -> None:
    result = await sandbox.exec(command, timeout=timeout, cwd="/")
    if result.exit_code != 0:
        tail = output_tail(result.stdout, result.stderr)
        raise _error(
            task,
            step,
            f"could not place its files: {command[:200]!r} exited {result.exit_code}:\n{tail}",
            exit_code=result.exit_code,
            output=tail,
        )


def _error(
    task: Task, step: CopyStep, what: str, *, exit_code: int | None, output: str
) -> TaskSetupError:
    return TaskSetupError(
        f"task {task.task_id}: Dockerfile {step.describe()} {what}",
        task_id=task.task_id,
        command=f"{step.keyword} {' '.join(step.sources)} {step.dest}",
        exit_code=exit_code,
        output=output,
    )
