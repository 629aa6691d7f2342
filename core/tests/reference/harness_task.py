"""The tasks and renderer of the conformance tests of harnesses that act in a sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.errors import UnknownComponentError
from rllm_core.plugins import PluginManager
from rllm_core.testing.suites.harnesses import GradedTask
from rllm_core.types import SandboxSpec, Task

SHIPPED_TASK = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "shell" / "count-lines"


class MakeFileTask:
    """Mixed into a :class:`~rllm_core.testing.suites.harnesses.HarnessConformance` subclass:
    its ``harness_task`` asks for ``made.txt`` in a fresh ``work`` folder, and its gateway
    renders with the toy renderer. The subclass's script writes that file."""

    @pytest.fixture
    def harness_task(self, tmp_path: Path) -> Task:
        return Task(
            task_id="make-file",
            instruction="Create made.txt.",
            environment=SandboxSpec(workdir=str(tmp_path / "work")),
        )

    @pytest.fixture
    def gateway_renderer(self) -> ToyChatRenderer:
        return ToyChatRenderer()


class ShippedShellTask:
    """Mixed into a :class:`~rllm_core.testing.suites.harnesses.HarnessConformance` subclass:
    its ``graded_task`` is the shipped Harbor task ``count-lines``, prepared and graded by the
    installed ``harbor`` task source in a bubblewrap sandbox, solved by its own
    ``solution/solve.sh``. Skipped without bubblewrap or the harbor plugin."""

    @pytest.fixture
    def graded_task(self) -> GradedTask:
        pytest.importorskip("rllm_sandbox_backend_local.testing").require_bubblewrap()
        try:
            spec = PluginManager(strict=False).get("task_source", "harbor")
        except UnknownComponentError:
            pytest.skip("the `harbor` task source is not installed (rllm-task-source-harbor)")
        source = spec.build({"path": str(SHIPPED_TASK)})
        (task,) = source.tasks()
        solution = (SHIPPED_TASK / "solution" / "solve.sh").read_text()
        return GradedTask(source=source, task=task, solution=solution)
