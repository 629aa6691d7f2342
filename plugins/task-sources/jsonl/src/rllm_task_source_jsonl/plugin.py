"""Entry module: the config of the ``jsonl`` task source and its spec.

Imports only rllm-core, pydantic and the standard library; the reader and the reward functions
load when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["JsonlTasksConfig"]


class JsonlTasksConfig(BaseModel):
    """Keys of ``[tasks] name = "jsonl"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="JSON-lines file, one task per line: the train split, or every split when"
        " split_field is set; relative paths are read from the plan's folder"
    )
    eval_path: Path | None = Field(
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
    question_field: str = Field(default="question", description="field holding the question")
    answer_field: str = Field(
        default="answer", description="field holding the expected answer (string or number)"
    )
    reward: Literal["exact", "numeric", "boxed"] = Field(
        default="exact",
        description="how a reply is compared with the answer: exact (whole reply, stripped,"
        " case-sensitive), numeric (last number in the reply) or boxed (last \\boxed{})",
    )
    tolerance: float = Field(
        default=1e-6,
        ge=0.0,
        description="absolute tolerance of the numeric and boxed comparisons",
    )
    first_number_credit: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="numeric only: reward when the last number is wrong but the first number"
        " of the reply is right (0 turns partial credit off)",
    )
    system_prompt: str | None = Field(
        default=None,
        description="system prompt stored in every task as data['system_prompt'] for the"
        " harness to send",
    )
    limit: int | None = Field(
        default=None, ge=1, description="keep only the first N tasks of each split"
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> JsonlTasksConfig:
        if self.eval_path is not None and self.split_field is not None:
            raise ValueError(
                "set either eval_path (one file per split) or split_field (one file with a"
                " split column), not both"
            )
        if self.first_number_credit > 0.0 and self.reward != "numeric":
            raise ValueError(
                f"first_number_credit applies to reward = 'numeric', not {self.reward!r};"
                " remove it or switch the reward"
            )
        return self


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
