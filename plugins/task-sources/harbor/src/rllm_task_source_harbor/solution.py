"""Running a task's reference solution, as an agent would, to check the task is solvable."""

from __future__ import annotations

from pathlib import Path

from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import ExecResult, Task

from rllm_task_source_harbor.upload import upload_dir

__all__ = ["SOLUTION_DIR", "run_solution"]

SOLUTION_DIR = "/solution"


async def run_solution(task: Task, sandbox: Sandbox) -> ExecResult:
    """Upload the task's ``solution/`` to ``/solution`` and run ``bash /solution/solve.sh`` as
    the agent user, in the workdir, with ``[solution].env``, within the agent timeout.

    Returns the script's result whatever its exit code. Raises ``TaskFormatError`` when the
    task has no ``solution/solve.sh`` and ``SandboxCommandTimeout`` when it runs too long.
    """
    task_dir = Path(task.data["task_dir"])
    if not (task_dir / "solution" / "solve.sh").is_file():
        raise TaskFormatError(
            [
                TaskProblem(
                    task=task.task_id,
                    field="solution/solve.sh",
                    message=f"missing: add {task_dir / 'solution' / 'solve.sh'} to run the"
                    " reference solution",
                )
            ]
        )
    await upload_dir(sandbox, task_dir / "solution", SOLUTION_DIR)
    spec = task.environment
    return await sandbox.exec(
        f"bash {SOLUTION_DIR}/solve.sh",
        timeout=task.agent_timeout_s,
        user=task.data.get("agent_user") or (spec.user if spec else None),
        env=task.data.get("solution_env") or None,
        cwd=spec.workdir if spec else None,
    )
