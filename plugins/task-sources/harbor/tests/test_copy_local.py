"""A shipped-style task whose Dockerfile copies files from its build context, replayed end to
end in the ``local`` sandbox: the copied files are where the Dockerfile put them, a later
``RUN`` sees them, the healthcheck passes and the reference solution is rewarded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rllm_core.plugins import PluginManager
from rllm_core.types import Grade, HarnessOutcome, Termination

COPY_CONTEXT = Path(__file__).parent / "tasks" / "copy-context"


def test_copied_files_are_visible_to_commands_in_the_local_sandbox():
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()
    plugins = PluginManager()
    source = plugins.get("task_source", "harbor").build({"path": str(COPY_CONTEXT)})
    (task,) = source.tasks()
    assert source.check().tasks[0].setup == "1 RUN, 3 COPY + healthcheck"
    backend = plugins.get("sandbox_backend", "local").build({"isolation": "bwrap"})

    async def main():
        try:
            async with await backend.create(task.environment) as sandbox:
                await source.prepare(task, sandbox)
                seen = await sandbox.exec(
                    "cat data/prices.csv; bin/greet; cat 'docs/notes one.txt' docs/readme.txt"
                    " data/lines.txt; ls data/nested; stat -c %a bin/greet",
                    timeout=10,
                )
                solved = await source.run_solution(task, sandbox)
                grade = await source.grade(
                    task, HarnessOutcome(termination=Termination.DONE), sandbox
                )
                return seen, solved, grade
        finally:
            await backend.close()

    seen, solved, grade = asyncio.run(main())
    assert seen.exit_code == 0, seen
    assert seen.stdout.splitlines() == [
        "apple,3",
        "pear,4",
        "plum,5",
        "hello",
        "Copied with a space in its name.",
        "Prices are whole numbers.",
        "3",
        "readme.txt",
        "755",
    ]
    assert solved.exit_code == 0, solved
    assert grade == Grade(reward=1.0)
