"""The task sets shipped in examples/tasks.

Every shell task runs twice through the real ``local`` sandbox backend and the ``harbor`` task
source: its reference solution must earn reward 1 and an agent that does nothing must get 0, so
each verifier both accepts the solution and rejects the starting state. The same holds when
the whole set goes through ``rllm-core tasks check --solve --noop``. The JSON-lines sets must
be exactly what their generator writes, and load through the ``jsonl`` task source.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from rllm_core.plugins import PluginManager
from rllm_core.ports.agents import CheckableTaskSource
from rllm_core.types import HarnessOutcome, Task, Termination

REPO_ROOT = Path(__file__).resolve().parent.parent
TASKS_DIR = REPO_ROOT / "examples" / "tasks"
SHELL_DIR = TASKS_DIR / "shell"
SHELL_TASKS = sorted(p.name for p in SHELL_DIR.iterdir() if (p / "task.toml").is_file())


def require_bubblewrap() -> None:
    """Harbor tasks use absolute paths (/app, /tests, /logs) that only the bubblewrap sandbox
    makes private; skip without it, fail in CI (which installs it)."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()


def local_backend():
    pytest.importorskip(
        "rllm_sandbox_backend_local", reason="rllm-sandbox-backend-local is not installed"
    )
    require_bubblewrap()
    return PluginManager().get("sandbox_backend", "local").build({"isolation": "bwrap"})


async def reward_of(source: CheckableTaskSource, task: Task, *, solve: bool) -> tuple[float, str]:
    """Create a fresh sandbox, optionally run the solution, then the verifier."""
    backend = local_backend()
    try:
        async with await backend.create(task.environment) as sandbox:
            await source.prepare(task, sandbox)
            log = ""
            if solve:
                result = await source.run_solution(task, sandbox)
                log = f"solve.sh exited {result.exit_code}: {result.stdout}{result.stderr}"
                assert result.exit_code == 0, log
            outcome = HarnessOutcome(termination=Termination.DONE)
            grade = await source.grade(task, outcome, sandbox)
            return grade.reward, log
    finally:
        await backend.close()


@pytest.fixture(scope="module")
def shell_source() -> CheckableTaskSource:
    pytest.importorskip(
        "rllm_task_source_harbor", reason="rllm-task-source-harbor is not installed"
    )
    source = PluginManager().get("task_source", "harbor").build({"path": str(SHELL_DIR)})
    assert isinstance(source, CheckableTaskSource)
    return source


@pytest.fixture(scope="module")
def shell_tasks(shell_source) -> dict[str, Task]:
    return {task.task_id: task for task in shell_source.tasks()}


def test_shell_set_has_at_least_twenty_complete_tasks(shell_tasks):
    assert len(SHELL_TASKS) >= 20
    assert sorted(shell_tasks) == SHELL_TASKS
    for name, task in shell_tasks.items():
        folder = SHELL_DIR / name
        for part in (
            "instruction.md",
            "environment/Dockerfile",
            "tests/test.sh",
            "solution/solve.sh",
        ):
            assert (folder / part).is_file(), f"{name}: missing {part}"
        assert task.environment is not None
        assert task.environment.image == "debian:bookworm-slim", name
        assert task.environment.workdir == "/app", name
        assert task.data["has_solution"] is True, name
        assert task.metadata["dataset"] == "rllm-shell-basics"
        assert "/app" in task.instruction, f"{name}: the instruction must say where to work"


def test_shell_tasks_use_no_copy_and_write_the_reward_file():
    for name in SHELL_TASKS:
        dockerfile = (SHELL_DIR / name / "environment" / "Dockerfile").read_text()
        assert not re.search(r"^\s*(COPY|ADD)\b", dockerfile, re.MULTILINE | re.IGNORECASE), name
        test = (SHELL_DIR / name / "tests" / "test.sh").read_text()
        assert "mkdir -p /logs/verifier" in test, name
        assert "/logs/verifier/reward.txt" in test, name


@pytest.mark.parametrize("name", SHELL_TASKS)
def test_solution_earns_1_and_a_noop_agent_gets_0(name, shell_source, shell_tasks):
    task = shell_tasks[name]

    async def both() -> list[tuple[float, str]]:
        # Two sandboxes of their own, side by side.
        return await asyncio.gather(
            reward_of(shell_source, task, solve=True), reward_of(shell_source, task, solve=False)
        )

    (solved, log), (untouched, _) = asyncio.run(both())
    assert solved == 1.0, log
    assert untouched == 0.0


def test_tasks_check_cli_solves_every_task(run_cli):
    pytest.importorskip(
        "rllm_sandbox_backend_local", reason="rllm-sandbox-backend-local is not installed"
    )
    require_bubblewrap()
    result = run_cli("tasks", "check", str(SHELL_DIR), "--solve", "--noop", "--jobs", "2", "--json")
    assert result.returncode == 0, result
    report = result.json()
    assert report["ok"] is True
    assert report["dataset"] == "rllm-shell-basics"
    rewards = {
        task["task_id"]: (task["runs"]["solve"]["reward"], task["runs"]["noop"]["reward"])
        for task in report["tasks"]
    }
    assert rewards == {name: (1.0, 0.0) for name in SHELL_TASKS}


# ---------------------------------------------------------------- question/answer sets


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_arithmetic", TASKS_DIR / "make_arithmetic.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_rows(name: str) -> list[dict[str, str]]:
    text = (TASKS_DIR / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_regenerating_the_jsonl_sets_gives_the_shipped_files_byte_for_byte(tmp_path):
    generator = load_generator()
    assert generator.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["arithmetic-eval.jsonl", "arithmetic.jsonl", "word-problems.jsonl"]
    for name in written:
        assert (tmp_path / name).read_bytes() == (TASKS_DIR / name).read_bytes(), name
    assert generator.main(["--check"]) == 0


def test_arithmetic_answers_are_right_and_the_splits_do_not_overlap():
    train, evaluation = read_rows("arithmetic.jsonl"), read_rows("arithmetic-eval.jsonl")
    assert (len(train), len(evaluation)) == (240, 60)
    for row in train + evaluation:
        match = re.fullmatch(r"What is (\d{1,2}) ([+-]) (\d{1,2})\?", row["question"])
        assert match, row
        a, op, b = int(match[1]), match[2], int(match[3])
        assert row["answer"] == str(a + b if op == "+" else a - b), row
        assert int(row["answer"]) >= 0, row
    assert not {r["question"] for r in train} & {r["question"] for r in evaluation}
    assert len({r["id"] for r in train + evaluation}) == 300


def test_word_problem_answers_follow_from_their_numbers():
    rows = read_rows("word-problems.jsonl")
    assert len(rows) == 120
    assert sum(row["split"] == "eval" for row in rows) == 24
    for row in rows:
        first, second = (int(n) for n in re.findall(r"\d+", row["question"]))
        expected = first + second if "more" in row["question"] else first - second
        assert row["answer"] == str(expected), row


def test_jsonl_sets_load_and_grade_through_the_jsonl_source():
    pytest.importorskip("rllm_task_source_jsonl", reason="rllm-task-source-jsonl is not installed")
    manager = PluginManager()
    spec = manager.get("task_source", "jsonl")
    arithmetic = spec.build(
        {
            "path": str(TASKS_DIR / "arithmetic.jsonl"),
            "eval_path": str(TASKS_DIR / "arithmetic-eval.jsonl"),
            "reward": "numeric",
            "first_number_credit": 0.5,
        }
    )
    assert (len(arithmetic.tasks("train")), len(arithmetic.tasks("eval"))) == (240, 60)
    words = spec.build({"path": str(TASKS_DIR / "word-problems.jsonl"), "split_field": "split"})
    assert (len(words.tasks("train")), len(words.tasks("eval"))) == (96, 24)

    first = arithmetic.tasks("train")[0]
    assert (first.instruction, first.data["answer"]) == ("What is 31 - 3?", "28")

    def grade(answer: str) -> float:
        outcome = HarnessOutcome(termination=Termination.DONE, answer=answer)
        return asyncio.run(arithmetic.grade(first, outcome, None)).reward

    assert grade("31 - 3 = 28") == 1.0
    assert grade("28. Next, 5") == 0.5
    assert grade("27") == 0.0
