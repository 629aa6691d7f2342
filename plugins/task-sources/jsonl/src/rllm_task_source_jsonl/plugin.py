"""Entry module: the config of the ``jsonl`` task source and its spec.

Imports only rllm-core, pydantic and the standard library; the reader and the reward functions
load when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import Field
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy
from rllm_core.kit.qa_tasks import QATasksConfig

__all__ = ["JsonlTasksConfig"]


class JsonlTasksConfig(QATasksConfig):
    """Keys of ``[tasks] name = "jsonl"`` (the question/answer keys of
    :class:`~rllm_core.kit.qa_tasks.QATasksConfig`, over JSON-lines files)."""

    path: Annotated[Path, PlanPath(expects="file")] = Field(
        description="JSON-lines file, one task per line: the train split, or every split when"
        " split_field is set; relative paths are read from the plan's folder"
    )
    eval_path: Annotated[Path | None, PlanPath(expects="file")] = Field(
        default=None,
        description="JSON-lines file of the eval split (cannot be combined with split_field)",
    )
    split_field: str | None = Field(
        default=None,
        description="field of each line naming its split (e.g. 'split'); the splits are the"
        " values found in path",
    )
    id_field: str = Field(
        default="id",
        description="field holding the task id; a line without it gets '<file stem>-<line>'",
    )


@hookimpl
def rllm_task_sources() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="task_source",
        name="jsonl",
        factory=lazy("rllm_task_source_jsonl.source:JsonlTaskSource"),
        config=JsonlTasksConfig,
        summary="question/answer tasks from JSON-lines files, graded by exact, numeric or"
        " \\boxed{} match",
    )
