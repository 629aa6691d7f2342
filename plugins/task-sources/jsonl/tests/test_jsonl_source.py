"""Reading JSON-lines files into tasks, splits, limits, load errors and grading."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.ports import TaskSource
from rllm_core.types import Grade, HarnessOutcome, Termination
from rllm_task_source_jsonl.plugin import JsonlTasksConfig
from rllm_task_source_jsonl.source import JsonlTaskSource


def write_lines(path: Path, *rows: object) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def build(**keys: object) -> JsonlTaskSource:
    return JsonlTaskSource(JsonlTasksConfig.model_validate(keys))


def grade(source: JsonlTaskSource, task, answer: str | None) -> Grade:
    outcome = HarnessOutcome(termination=Termination.DONE, answer=answer)
    return asyncio.run(source.grade(task, outcome, None))


@pytest.fixture
def two_files(tmp_path):
    train = write_lines(
        tmp_path / "train.jsonl",
        {"id": "a", "question": "What is 2 + 3?", "answer": "5"},
        "",
        {"id": 7, "question": "What is 9 - 4?", "answer": 5},
        {"question": "What is 1 + 1?", "answer": 2.5},
    )
    evaluation = write_lines(
        tmp_path / "eval.jsonl", {"id": "e1", "question": "What is 6 + 6?", "answer": "12"}
    )
    return train, evaluation


def test_train_and_eval_files(two_files):
    train, evaluation = two_files
    source = build(path=str(train), eval_path=str(evaluation), reward="numeric")
    assert isinstance(source, TaskSource)
    assert source.splits == ("train", "eval")
    tasks = source.tasks("train")
    assert [t.task_id for t in tasks] == ["a", "7", "train-4"]
    assert [t.instruction for t in tasks] == ["What is 2 + 3?", "What is 9 - 4?", "What is 1 + 1?"]
    assert [t.data for t in tasks] == [
        {"answer": "5", "reward": "numeric"},
        {"answer": "5", "reward": "numeric"},
        {"answer": "2.5", "reward": "numeric"},
    ]
    assert tasks[1].metadata == {"split": "train", "file": str(train), "line": 3}
    assert tasks[0].source == "jsonl"
    assert tasks[0].environment is None
    (only,) = source.tasks("eval")
    assert (only.task_id, only.metadata["split"], only.metadata["line"]) == ("e1", "eval", 1)


def test_default_split_is_train_and_unknown_split_is_a_key_error(two_files):
    train, _ = two_files
    source = build(path=str(train))
    assert source.tasks() is source.tasks("train")
    with pytest.raises(KeyError, match="has no split 'eval'; available: train"):
        source.tasks("eval")


def test_split_field(tmp_path):
    path = write_lines(
        tmp_path / "all.jsonl",
        {"id": "1", "split": "train", "question": "q1", "answer": "x"},
        {"id": "2", "split": "eval", "question": "q2", "answer": "y"},
        {"id": "3", "split": "train", "question": "q3", "answer": "z"},
        {"id": "4", "split": "test", "question": "q4", "answer": "w"},
    )
    source = build(path=str(path), split_field="split")
    assert source.splits == ("train", "eval", "test")
    assert [t.task_id for t in source.tasks("train")] == ["1", "3"]
    assert [t.task_id for t in source.tasks("eval")] == ["2"]
    assert [t.task_id for t in source.tasks("test")] == ["4"]


def test_limit_keeps_the_first_tasks_of_each_split(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
    path = write_lines(tmp_path / "t.jsonl", *rows)
    evaluation = write_lines(tmp_path / "e.jsonl", *rows[:1])
    source = build(path=str(path), eval_path=str(evaluation), limit=2, id_field="none")
    assert [t.instruction for t in source.tasks("train")] == ["q0", "q1"]
    assert [t.instruction for t in source.tasks("eval")] == ["q0"]


def test_custom_fields_and_system_prompt(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl", {"key": "k1", "prompt": "Capital of France?", "gold": "Paris"}
    )
    source = build(
        path=str(path),
        id_field="key",
        question_field="prompt",
        answer_field="gold",
        system_prompt="Answer in one word.",
    )
    (task,) = source.tasks()
    assert (task.task_id, task.instruction) == ("k1", "Capital of France?")
    assert task.data == {
        "answer": "Paris",
        "reward": "exact",
        "system_prompt": "Answer in one word.",
    }


def test_every_problem_is_reported_with_file_line_and_field(tmp_path):
    train = write_lines(
        tmp_path / "train.jsonl",
        {"id": "a", "question": "ok", "answer": "1"},
        '{"id": "b", "question": ',
        "[1, 2]",
        {"id": "c", "answer": "1"},
        {"id": "d", "question": "q", "answer": "twelve"},
        {"id": "e", "question": "q", "answer": True},
        {"id": ["x"], "question": "q", "answer": "1"},
    )
    evaluation = write_lines(tmp_path / "eval.jsonl", {"id": "a", "question": "q", "answer": "2"})
    with pytest.raises(TaskFormatError) as caught:
        build(path=str(train), eval_path=str(evaluation), reward="numeric")
    problems = caught.value.problems
    assert [(p.task, p.field) for p in problems] == [
        (f"{train}:2", "(line)"),
        (f"{train}:3", "(line)"),
        (f"{train}:4", "question"),
        (f"{train}:5", "answer"),
        (f"{train}:6", "answer"),
        (f"{train}:7", "id"),
        (f"{evaluation}:1", "id"),
    ]
    assert problems[1].message == "expected a JSON object, got list"
    assert problems[2].message == "needs a non-empty string, got None"
    assert "'twelve' is not a number" in problems[3].message
    assert problems[6].message == f"id 'a' is already used at {train}:1"
    assert str(problems[0]).startswith(f"{train}:2: (line): not JSON: ")


def test_exact_reward_accepts_any_answer_text(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", {"question": "q", "answer": "twelve"})
    (task,) = build(path=str(path)).tasks()
    assert task.data["answer"] == "twelve"


def test_missing_and_empty_files(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TaskFormatError) as caught:
        build(path=str(missing))
    assert caught.value.problems == [
        TaskProblem(task=str(missing), field="path", message="file not found; check the path")
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(TaskFormatError, match="the file holds no tasks"):
        build(path=str(empty))


def test_split_field_must_name_a_split(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", {"question": "q", "answer": "1", "split": ""})
    with pytest.raises(TaskFormatError) as caught:
        build(path=str(path), split_field="split")
    assert [(p.task, p.field) for p in caught.value.problems] == [(f"{path}:1", "split")]


def test_grade_with_each_reward(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", {"question": "What is 9 + 3?", "answer": "12"})
    (task,) = build(path=str(path), reward="exact").tasks()
    assert grade(build(path=str(path)), task, " 12\n") == Grade(reward=1.0, signals={"parsed": 1.0})
    assert grade(build(path=str(path)), task, "12.0") == Grade(reward=0.0, signals={"parsed": 1.0})
    numeric = build(path=str(path), reward="numeric", first_number_credit=0.5)
    assert grade(numeric, task, "9 + 3 = 12") == Grade(reward=1.0, signals={"parsed": 1.0})
    assert grade(numeric, task, "12, or 13") == Grade(reward=0.5, signals={"parsed": 1.0})
    assert grade(numeric, task, "no idea") == Grade(reward=0.0, signals={"parsed": 0.0})
    assert grade(numeric, task, None) == Grade(reward=0.0, signals={"parsed": 0.0})
    boxed = build(path=str(path), reward="boxed")
    assert grade(boxed, task, r"\boxed{12}") == Grade(reward=1.0, signals={"parsed": 1.0})
    assert grade(boxed, task, "12") == Grade(reward=0.0, signals={"parsed": 0.0})


def test_grade_refuses_a_task_without_an_answer(tmp_path):
    from rllm_core.types import Task

    path = write_lines(tmp_path / "t.jsonl", {"question": "q", "answer": "1"})
    with pytest.raises(ValueError, match="task 'other' has no string data\\['answer'\\]"):
        grade(build(path=str(path)), Task(task_id="other", instruction="q"), "1")


def test_config_combinations_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"either eval_path .* or split_field"):
        JsonlTasksConfig(path=tmp_path / "a", eval_path=tmp_path / "b", split_field="split")
    with pytest.raises(ValueError, match="first_number_credit applies to reward = 'numeric'"):
        JsonlTasksConfig(path=tmp_path / "a", first_number_credit=0.5)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        JsonlTasksConfig(path=tmp_path / "a", reward="numeric", first_number_credit=1.5)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        JsonlTasksConfig.model_validate({"path": "a", "paths": "b"})
