"""The datasets task source against the core's task source conformance suite, over parquet
files the test writes (no network)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rllm_core.testing.suites.task_sources import GradeCase, TaskSourceConformance
from rllm_core.types import HarnessOutcome, Termination
from rllm_task_source_datasets.plugin import DatasetsTasksConfig
from rllm_task_source_datasets.source import DatasetsTaskSource

TRAIN = [
    {"id": "t-1", "question": "What is 31 - 3?", "answer": 28},
    {"id": "t-2", "question": "What is 2 + 2?", "answer": 4},
    {"id": "t-3", "question": "What is 10 - 7?", "answer": 3},
]
EVAL = [{"id": "e-1", "question": "What is 4 + 4?", "answer": 8}]


def done(answer: str) -> HarnessOutcome:
    return HarnessOutcome(termination=Termination.DONE, answer=answer)


class TestDatasetsParquet(TaskSourceConformance):
    task_splits = ("train", "eval")

    @pytest.fixture
    def rebuild_task_source(self, tmp_path: Path, monkeypatch) -> Callable[[], DatasetsTaskSource]:
        import datasets.config

        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
        pq.write_table(pa.Table.from_pylist(TRAIN), tmp_path / "train.parquet")
        pq.write_table(pa.Table.from_pylist(EVAL), tmp_path / "test.parquet")
        config = DatasetsTasksConfig(
            path=tmp_path / "train.parquet", eval_path=tmp_path / "test.parquet", reward="numeric"
        )
        return lambda: DatasetsTaskSource(config)

    @pytest.fixture
    def grade_cases(self) -> list[GradeCase]:
        return [
            GradeCase("t-1", done("28"), reward=1.0),
            GradeCase("t-2", done("5"), reward=0.0),
            GradeCase("e-1", done("It is 8."), reward=1.0, split="eval"),
        ]
