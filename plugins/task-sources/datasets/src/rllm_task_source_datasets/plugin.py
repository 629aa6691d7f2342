"""Entry module: the config of the ``datasets`` task source and its spec.

Imports only rllm-core, pydantic and the standard library; ``datasets`` and the reader load
when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy
from rllm_core.kit.qa_tasks import QATasksConfig

__all__ = ["FORMATS", "DatasetsTasksConfig"]

FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
"""File suffixes ``format = "auto"`` recognises, and the ``datasets`` builder each one takes."""


class DatasetsTasksConfig(QATasksConfig):
    """Keys of ``[tasks] name = "datasets"``: the question/answer keys the ``jsonl`` source
    takes too (:class:`~rllm_core.kit.qa_tasks.QATasksConfig`: field mapping, splits, reward),
    over files ``datasets.load_dataset`` reads."""

    path: Annotated[Path, PlanPath(expects="file-or-dir")] = Field(
        description="a parquet, arrow or JSON-lines file, or a folder of such files (read in"
        " name order), one task per row: the train split, or every split when split_field is"
        " set; relative paths are read from the plan's folder"
    )
    eval_path: Annotated[Path | None, PlanPath(expects="file-or-dir")] = Field(
        default=None,
        description="file or folder of the eval split, in the same format (cannot be combined"
        " with split_field)",
    )
    format: Literal["auto", "parquet", "arrow", "json"] = Field(
        default="auto",
        description="the datasets builder that reads the files; 'auto' picks it from the file"
        " suffix (.parquet, .arrow, .jsonl or .json)",
    )


@hookimpl
def rllm_task_sources() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="task_source",
        name="datasets",
        factory=lazy("rllm_task_source_datasets.source:DatasetsTaskSource"),
        config=DatasetsTasksConfig,
        summary="question/answer tasks from local parquet, arrow or JSON-lines files read with"
        " Hugging Face datasets, graded like the jsonl source",
    )
