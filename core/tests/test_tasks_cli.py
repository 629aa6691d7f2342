"""``rllm-core tasks check`` reaches the task format only through the ``harbor`` task source's
:class:`~rllm_core.ports.agents.CheckableTaskSource` methods: here a source of the test's own,
and no source at all. The harbor package's own tests run the command over real task
directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict
from reference.subprocess_sandbox import SubprocessBackend
from rllm_core import ComponentSpec, hookimpl
from rllm_core.cli import main, tasks_cmd
from rllm_core.errors import TaskProblem
from rllm_core.plugins import PluginManager
from rllm_core.ports.agents import CheckableTaskSource, DatasetCheck, TaskCheck
from rllm_core.types import ExecResult, Grade, SandboxSpec, Task


class FolderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path
    replay_dockerfile: bool | None = None


class FolderSource:
    """Every ``*.txt`` file of the folder is a task whose text is the command that solves it;
    the verifier gives 1 when ``done`` exists in the sandbox's working directory."""

    def __init__(self, config: FolderConfig) -> None:
        self.config = config
        self.calls: list[tuple[str, str]] = []
        BUILT.append(self)

    def tasks(self, split: str = "train") -> list[Task]:
        return [c.task for c in self.check(split).tasks if c.task is not None]

    def check(self, split: str = "train", *, require_solution: bool = False) -> DatasetCheck:
        report = DatasetCheck(path=self.config.path, name=self.config.path.name)
        for file in sorted(self.config.path.glob("*.txt")):
            check = TaskCheck(task_dir=file, task_id=file.stem)
            command = file.read_text().strip()
            check.has_solution = bool(command)
            if require_solution and not command:
                check.problems.append(TaskProblem(task=file.stem, field="text", message="empty"))
            else:
                check.task = Task(
                    task_id=file.stem,
                    instruction="make done",
                    source="folder",
                    data={"command": command},
                    environment=SandboxSpec(workdir=str(file.parent / f"{file.stem}-work")),
                )
                check.settings = {"replay": self.config.replay_dockerfile}
                check.setup = "mkdir"
            report.tasks.append(check)
        return report

    async def prepare(self, task: Task, sandbox: Any) -> None:
        self.calls.append(("prepare", task.task_id))
        workdir = task.environment.workdir
        await sandbox.exec(f"rm -rf {workdir} && mkdir -p {workdir}", timeout=10, cwd="/")

    async def run_solution(self, task: Task, sandbox: Any) -> ExecResult:
        self.calls.append(("solve", task.task_id))
        return await sandbox.exec(task.data["command"], timeout=10, cwd=task.environment.workdir)

    async def grade(self, task: Task, outcome: Any, sandbox: Any) -> Grade:
        self.calls.append(("grade", task.task_id))
        result = await sandbox.exec("test -e done", timeout=10, cwd=task.environment.workdir)
        return Grade(reward=1.0 if result.exit_code == 0 else 0.0)


BUILT: list[FolderSource] = []


def use(monkeypatch, *, harbor: bool) -> None:
    class Plugin:
        @hookimpl
        def rllm_sandbox_backends(self):
            yield ComponentSpec(
                kind="sandbox_backend",
                name="subprocess",
                factory=lambda config: SubprocessBackend(),
                summary="test",
            )

        if harbor:

            @hookimpl
            def rllm_task_sources(self):
                yield ComponentSpec(
                    kind="task_source",
                    name="harbor",
                    factory=FolderSource,
                    config=FolderConfig,
                    summary="test",
                )

    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(Plugin(), name="test")
    monkeypatch.setattr(tasks_cmd, "get_plugin_manager", lambda: manager)
    BUILT.clear()


def invoke(*args: str):
    return CliRunner().invoke(main, ["tasks", "check", *args])


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "a.txt").write_text("touch done\n")
    (tmp_path / "b.txt").write_text("true\n")
    return tmp_path


def test_the_fake_implements_the_protocol(folder):
    assert isinstance(FolderSource(FolderConfig(path=folder)), CheckableTaskSource)


def test_without_the_harbor_plugin_it_names_the_package_to_install(monkeypatch, folder):
    use(monkeypatch, harbor=False)
    result = invoke(str(folder))
    assert result.exit_code == 2
    assert "pip install rllm-task-source-harbor" in result.output
    report = json.loads(invoke(str(folder), "--json").output)
    assert report["ok"] is False
    assert "pip install rllm-task-source-harbor" in report["error"]


def test_a_source_without_the_check_methods_is_refused(monkeypatch, folder):
    class Plain:
        def __init__(self, config):
            pass

        def tasks(self, split="train"):
            return []

        async def grade(self, task, outcome, sandbox):
            return Grade(reward=0.0)

    class Plugin:
        @hookimpl
        def rllm_task_sources(self):
            yield ComponentSpec(
                kind="task_source", name="harbor", factory=Plain, config=FolderConfig, summary="x"
            )

    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(Plugin(), name="plain")
    monkeypatch.setattr(tasks_cmd, "get_plugin_manager", lambda: manager)
    result = invoke(str(folder))
    assert result.exit_code == 2
    assert "cannot check tasks" in result.output
    assert "pip install -U rllm-task-source-harbor" in result.output


def test_the_source_reads_the_directory_and_its_settings_are_listed(monkeypatch, folder):
    use(monkeypatch, harbor=True)
    result = invoke(str(folder), "--no-replay", "--json")
    assert result.exit_code == 0, result.output
    (source,) = BUILT
    assert source.config == FolderConfig(path=folder, replay_dockerfile=False)
    report = json.loads(result.output)
    assert [t["task_id"] for t in report["tasks"]] == ["a", "b"]
    settings = report["tasks"][0]["settings"]
    assert (settings["replay"], settings["setup"], settings["has_solution"]) == (
        False,
        "mkdir",
        True,
    )


def test_solve_and_noop_go_through_prepare_run_solution_and_grade(monkeypatch, folder):
    use(monkeypatch, harbor=True)
    result = invoke(str(folder), "--solve", "--noop", "--sandbox", "subprocess", "--json")
    assert result.exit_code == 1, result.output
    runs = {t["task_id"]: t["runs"] for t in json.loads(result.output)["tasks"]}
    assert (runs["a"]["solve"]["reward"], runs["a"]["noop"]["reward"]) == (1.0, 0.0)
    assert (runs["b"]["solve"]["passed"], runs["b"]["noop"]["passed"]) == (False, True)
    (source,) = BUILT
    solve_calls = [name for name, task in source.calls if task == "a"]
    assert solve_calls.count("prepare") == 2 and solve_calls.count("solve") == 1


def test_solve_asks_the_source_for_solutions(monkeypatch, folder):
    use(monkeypatch, harbor=True)
    (folder / "c.txt").write_text("")
    result = invoke(str(folder), "--solve", "--sandbox", "subprocess")
    assert result.exit_code == 2
    assert "c: text: empty" in result.output
