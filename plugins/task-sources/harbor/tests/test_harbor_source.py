"""The ``harbor`` task source: its entry module, config, splits and grading."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from rllm_core.errors import SandboxFileNotFound, TaskFormatError, VerifierError
from rllm_core.plugins import PluginManager
from rllm_core.ports import TaskSource
from rllm_core.ports.agents import CheckableTaskSource
from rllm_core.types import ExecResult, Grade, HarnessOutcome, Termination
from rllm_task_source_harbor import plugin
from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.source import HarborTaskSource

TOML = '[agent]\ntimeout_sec = 10\n[verifier]\ntimeout_sec = 5\nuser = "checker"\n'


def write_task(root: Path, name: str, toml: str = TOML) -> Path:
    task_dir = root / name
    for relative, text in {
        "task.toml": toml,
        "instruction.md": f"Do {name}.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nRUN touch seed\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }.items():
        path = task_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return task_dir


@pytest.fixture
def dataset(tmp_path) -> Path:
    for name in ("c", "a", "b"):
        write_task(tmp_path / "train", name)
    write_task(tmp_path / "eval", "e1")
    write_task(tmp_path / "hard", "h1")
    return tmp_path


class FakeSandbox:
    """Records execs and writes; reads back the reward files it was given."""

    merges_output = False

    def __init__(self, rewards: dict[str, bytes]) -> None:
        self.rewards = rewards
        self.files: dict[str, bytes] = {}
        self.execs: list[tuple[str, str | None]] = []

    async def exec(self, command, timeout, user=None, env=None, cwd=None) -> ExecResult:
        self.execs.append((command, user))
        return ExecResult(exit_code=0, stdout="", stderr="")

    async def write_file(self, path, data) -> None:
        self.files[path] = data

    async def read_file(self, path) -> bytes:
        if path in self.rewards:
            return self.rewards[path]
        raise SandboxFileNotFound(path)


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_task_source_harbor.plugin\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rllm_task_source_harbor',"
        " 'rllm_core.kit'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_task_source_harbor', 'rllm_task_source_harbor.plugin']"


def test_registered_as_task_source_harbor(dataset):
    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(plugin, name="harbor", distribution="rllm-task-source-harbor")
    spec = manager.get("task_source", "harbor")
    assert spec.config is HarborConfig
    source = spec.build({"path": str(dataset / "train")})
    assert isinstance(source, HarborTaskSource)
    assert isinstance(source, TaskSource)


def test_installed_entry_point_provides_harbor():
    manager = PluginManager(disabled=())
    assert "harbor" in manager.names("task_source")


def test_config_rejects_unknown_keys_and_repeated_splits(tmp_path):
    with pytest.raises(pydantic.ValidationError, match="extra"):
        HarborConfig(path=tmp_path, dir=tmp_path)
    with pytest.raises(pydantic.ValidationError, match="splits repeats eval, train"):
        HarborConfig(path=tmp_path, splits={"eval": tmp_path, "train": tmp_path})
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        HarborConfig(path=tmp_path, limit=0)


def test_splits_in_id_order(dataset):
    source = HarborTaskSource(
        HarborConfig(
            path=dataset / "train", eval_path=dataset / "eval", splits={"hard": dataset / "hard"}
        )
    )
    assert source.splits == ["train", "eval", "hard"]
    assert [t.task_id for t in source.tasks()] == ["a", "b", "c"]
    assert [t.task_id for t in source.tasks("eval")] == ["e1"]
    assert [t.task_id for t in source.tasks("hard")] == ["h1"]
    assert source.tasks("train") is source.tasks("train")
    assert {t.source for t in source.tasks()} == {"harbor"}


def test_unknown_split_is_a_key_error(dataset):
    source = HarborTaskSource(HarborConfig(path=dataset / "train"))
    with pytest.raises(KeyError, match="no split 'eval'; it has train"):
        source.tasks("eval")


def test_limit_replay_and_verifier_user(dataset):
    config = HarborConfig(
        path=dataset / "train", limit=2, replay_dockerfile=False, verifier_user="root"
    )
    tasks = HarborTaskSource(config).tasks()
    assert [t.task_id for t in tasks] == ["a", "b"]
    assert [t.data["setup_steps"] for t in tasks] == [[], []]
    assert {t.data["verifier_user"] for t in tasks} == {"root"}
    default = HarborTaskSource(HarborConfig(path=dataset / "train")).tasks()[0]
    assert default.data["setup_steps"] == [
        {"run": "mkdir -p /app && cd /app && touch seed", "line": 3}
    ]
    assert default.data["verifier_user"] == "checker"


def test_format_problems_raise_on_first_use(dataset):
    write_task(dataset / "train", "broken", toml="[agent]\ntimeout_sec = 'soon'\n")
    source = HarborTaskSource(HarborConfig(path=dataset / "train"))
    with pytest.raises(TaskFormatError, match=r"broken: \[agent\].timeout_sec"):
        source.tasks()


def test_grade_runs_the_verifier(dataset):
    source = HarborTaskSource(HarborConfig(path=dataset / "train"))
    task = source.tasks()[0]
    sandbox = FakeSandbox({"/logs/verifier/reward.json": b'{"reward": 0.5, "passed": 2}'})
    outcome = HarnessOutcome(termination=Termination.DONE)
    grade = asyncio.run(source.grade(task, outcome, sandbox))
    assert grade == Grade(reward=0.5, signals={"passed": 2.0})
    assert sandbox.files == {"/tests/test.sh": b"echo 1 > /logs/verifier/reward.txt\n"}
    assert sandbox.execs[-1] == ("bash /tests/test.sh", "checker")


def test_grade_without_a_sandbox_is_a_verifier_error(dataset):
    source = HarborTaskSource(HarborConfig(path=dataset / "train"))
    task = source.tasks()[0]
    outcome = HarnessOutcome(termination=Termination.DONE)
    with pytest.raises(VerifierError, match="task a: a harbor task is graded in its sandbox"):
        asyncio.run(source.grade(task, outcome, None))


def test_checks_tasks_for_rllm_core_tasks_check(dataset):
    source = HarborTaskSource(HarborConfig(path=dataset / "train", limit=1))
    assert isinstance(source, CheckableTaskSource)
    report = source.check()
    assert report.ok and [c.task_id for c in report.tasks] == ["a", "b", "c"]
    first = report.tasks[0]
    assert (first.has_solution, first.setup) == (False, "1 RUN")
    assert first.settings == {
        "verifier_user": "checker",
        "replay_dockerfile": True,
        "setup_steps": 1,
        "healthcheck": None,
    }
    strict = source.check(require_solution=True)
    assert [str(p) for p in strict.all_problems] == [
        f"{name}: solution/solve.sh: missing; --solve needs a reference solution"
        for name in ("a", "b", "c")
    ]
    with pytest.raises(KeyError, match="no split 'eval'"):
        source.check("eval")


def test_prepare_replays_the_dockerfile_in_the_sandbox(dataset):
    source = HarborTaskSource(HarborConfig(path=dataset / "train"))
    task = source.tasks()[0]
    sandbox = FakeSandbox({})
    asyncio.run(source.prepare(task, sandbox))
    assert [command for command, _ in sandbox.execs] == [
        "mkdir -p /app",
        "mkdir -p /app && cd /app && touch seed",
    ]
    asyncio.run(source.prepare(task, None))
