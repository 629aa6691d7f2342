"""Harbor-format tasks: reading them, preparing their sandboxes, running their verifiers.

Lives in the core so that ``rllm-core tasks check`` works without any plugin; the ``harbor``
task source plugin is a thin component over these functions.

Typical use::

    task = load_task("examples/tasks/shell/count-lines")
    async with await backend.create(task.environment) as sandbox:
        await prepare_sandbox(task, sandbox)
        ...  # the harness acts, or run_solution(task, sandbox)
        grade = await run_verifier(task, sandbox)
"""

from __future__ import annotations

from rllm_core.tasks.dockerfile import DockerfileReplay, RunStep, parse_dockerfile
from rllm_core.tasks.harbor import (
    DatasetCheck,
    TaskCheck,
    check_dataset,
    check_task,
    load_dataset,
    load_task,
)
from rllm_core.tasks.prepare import prepare_sandbox
from rllm_core.tasks.sizes import parse_size_mb
from rllm_core.tasks.solution import SOLUTION_DIR, run_solution
from rllm_core.tasks.upload import upload_dir
from rllm_core.tasks.verifier import REWARD_FILES, TESTS_DIR, parse_reward, run_verifier

__all__ = [
    "REWARD_FILES",
    "SOLUTION_DIR",
    "TESTS_DIR",
    "DatasetCheck",
    "DockerfileReplay",
    "RunStep",
    "TaskCheck",
    "check_dataset",
    "check_task",
    "load_dataset",
    "load_task",
    "parse_dockerfile",
    "parse_reward",
    "parse_size_mb",
    "prepare_sandbox",
    "run_solution",
    "run_verifier",
    "upload_dir",
]
