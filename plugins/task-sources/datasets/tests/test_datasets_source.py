"""The ``datasets`` task source over parquet, arrow and JSON-lines files the tests write:
splits, field mapping, the problems it reports together, grading with each reward, and
building it from plan keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rllm_core.errors import TaskFormatError
from rllm_core.plugins import PluginManager
from rllm_core.types import HarnessOutcome, Termination
from rllm_task_source_datasets import plugin
from rllm_task_source_datasets.plugin import DatasetsTasksConfig
from rllm_task_source_datasets.source import DatasetsTaskSource

TRAIN = [
    {"id": "t-1", "question": "What is 31 - 3?", "answer": 28},
    {"id": "t-2", "question": "What is 2 + 2?", "answer": 4},
    {"id": "t-3", "question": "What is 10 - 7?", "answer": 3},
]
EVAL = [{"id": "e-1", "question": "What is 4 + 4?", "answer": 8}]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_arrow(path: Path, rows: list[dict]) -> Path:
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def build(**keys: object) -> DatasetsTaskSource:
    return DatasetsTaskSource(DatasetsTasksConfig.model_validate(keys))


def grade(source: DatasetsTaskSource, task, answer: str | None) -> tuple[float, float]:
    outcome = HarnessOutcome(termination=Termination.DONE, answer=answer)
    result = asyncio.run(source.grade(task, outcome, None))
    return result.reward, result.signals["parsed"]


@pytest.mark.parametrize("writer", [write_parquet, write_arrow, write_jsonl])
def test_train_and_eval_files_of_each_format(tmp_path, writer):
    suffix = {write_parquet: ".parquet", write_arrow: ".arrow", write_jsonl: ".jsonl"}[writer]
    train = writer(tmp_path / f"train{suffix}", TRAIN)
    held_out = writer(tmp_path / f"test{suffix}", EVAL)
    source = build(path=str(train), eval_path=str(held_out), reward="numeric")
    assert source.splits == ("train", "eval")
    tasks = source.tasks("train")
    assert [t.task_id for t in tasks] == ["t-1", "t-2", "t-3"]
    assert [t.data["answer"] for t in tasks] == ["28", "4", "3"]
    assert tasks[0].instruction == "What is 31 - 3?"
    assert tasks[0].source == "datasets"
    assert tasks[1].metadata == {"split": "train", "file": str(train), "line": 2}
    assert [t.task_id for t in source.tasks("eval")] == ["e-1"]
    assert grade(source, tasks[0], "31 - 3 = 28") == (1.0, 1.0)
    assert grade(source, tasks[2], "3.0") == (1.0, 1.0)
    assert grade(source, tasks[1], "five") == (0.0, 0.0)
    with pytest.raises(KeyError, match=r"the datasets task source over .* has no split 'dev'"):
        source.tasks("dev")


def test_split_field_custom_fields_system_prompt_and_limit(tmp_path):
    rows = [
        {"problem": "Is 7 prime?", "solution": "yes", "part": "train"},
        {"problem": "Is 8 prime?", "solution": "no", "part": "test"},
        {"problem": "Is 9 prime?", "solution": "no", "part": "train"},
        {"problem": "Is 2 prime?", "solution": "yes", "part": "train"},
    ]
    path = write_parquet(tmp_path / "primes.parquet", rows)
    source = build(
        path=str(path),
        split_field="part",
        question_field="problem",
        answer_field="solution",
        system_prompt="Answer yes or no.",
        limit=2,
    )
    assert source.splits == ("train", "test")
    train = source.tasks("train")
    assert [t.task_id for t in train] == ["primes-1", "primes-3"]
    assert train[0].data == {
        "answer": "yes",
        "reward": "exact",
        "system_prompt": "Answer yes or no.",
    }
    assert [t.instruction for t in source.tasks("test")] == ["Is 8 prime?"]
    assert grade(source, train[0], " yes\n") == (1.0, 1.0)
    assert grade(source, train[0], "Yes") == (0.0, 1.0)


def test_a_folder_of_files_is_one_dataset_in_name_order(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_parquet(folder / "part-1.parquet", TRAIN[2:])
    write_parquet(folder / "part-0.parquet", TRAIN[:2])
    (folder / "README.md").write_text("not data")
    source = build(path=str(folder), reward="boxed")
    assert [t.task_id for t in source.tasks("train")] == ["t-1", "t-2", "t-3"]
    task = source.tasks("train")[2]
    assert grade(source, task, r"so \boxed{3.0}") == (1.0, 1.0)


def test_every_problem_is_reported_with_file_row_and_field(tmp_path):
    train = write_parquet(
        tmp_path / "train.parquet",
        [
            {"id": "a", "question": "What is 1 + 1?", "answer": "2"},
            {"id": "a", "question": "What is 1 + 2?", "answer": "3"},
            {"id": "c", "question": "", "answer": "twelve"},
        ],
    )
    held_out = write_arrow(tmp_path / "eval.arrow", [{"id": "a", "question": "Q?", "answer": "1"}])
    with pytest.raises(TaskFormatError) as caught:
        build(path=str(train), eval_path=str(held_out), reward="numeric")
    text = str(caught.value)
    assert f"{train}:2: id: id 'a' is already used at {train}:1" in text
    assert f"{train}:3: question: needs a non-empty string" in text
    assert f"{train}:3: answer: reward 'numeric' needs a number" in text
    assert f"{held_out}:1: id: id 'a' is already used at {train}:1" in text


def test_missing_unreadable_and_mixed_files_are_problems(tmp_path):
    missing = tmp_path / "absent.parquet"
    with pytest.raises(TaskFormatError, match=r"absent\.parquet: path: file not found"):
        build(path=str(missing))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet")
    with pytest.raises(
        TaskFormatError,
        match=r"broken\.parquet: path: datasets could not read"
        r" it as parquet",
    ):
        build(path=str(broken))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_parquet(mixed / "a.parquet", TRAIN)
    write_jsonl(mixed / "b.jsonl", EVAL)
    with pytest.raises(TaskFormatError, match=r"format: format 'auto' needs files of one kind"):
        build(path=str(mixed))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskFormatError, match=r"empty: path: the folder holds no"):
        build(path=str(empty))


def test_a_float_column_gives_float_answers(tmp_path):
    path = write_parquet(tmp_path / "f.parquet", [{"question": "Half of 5?", "answer": 2.5}])
    source = build(path=str(path), reward="numeric")
    task = source.tasks("train")[0]
    assert (task.task_id, task.data["answer"]) == ("f-1", "2.5")
    assert grade(source, task, "It is 2.50") == (1.0, 1.0)


def test_format_names_the_builder_for_any_suffix(tmp_path):
    path = write_parquet(tmp_path / "train.data", TRAIN)
    with pytest.raises(TaskFormatError, match="format 'auto' needs files of one kind"):
        build(path=str(path))
    assert len(build(path=str(path), format="parquet").tasks("train")) == 3


def test_builds_from_plan_keys_and_checks_combinations(tmp_path):
    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(plugin, name="datasets", distribution="rllm-task-source-datasets")
    path = write_jsonl(tmp_path / "qa.jsonl", TRAIN)
    spec = manager.get("task_source", "datasets")
    source = spec.build({"path": str(path), "reward": "numeric", "first_number_credit": 0.5})
    assert isinstance(source, DatasetsTaskSource)
    assert len(source.tasks("train")) == 3
    with pytest.raises(ValueError, match=r"set either eval_path .* or split_field"):
        spec.build({"path": str(path), "eval_path": str(path), "split_field": "split"})
    with pytest.raises(ValueError, match="'parquet', 'arrow' or 'json'"):
        spec.build({"path": str(path), "format": "csv"})
