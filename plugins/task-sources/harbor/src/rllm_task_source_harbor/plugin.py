"""Entry module: the ``harbor`` task source's config and spec.

Imports only rllm-core, pydantic and the standard library; the source loads when built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy

__all__ = ["HarborConfig"]

_TASK_FOLDERS = PlanPath(expects="dir", each_holds="task.toml")
"""A task folder (one holding task.toml) or a folder of them."""


class HarborConfig(BaseModel):
    """Keys of ``[tasks] name = "harbor"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Annotated[Path, _TASK_FOLDERS] = Field(
        description="dataset directory (a directory of task directories) or one task"
        " directory: the train split"
    )
    eval_path: Annotated[Path | None, _TASK_FOLDERS] = Field(
        default=None, description="dataset directory of the eval split; unset: no eval split"
    )
    splits: Annotated[dict[str, Path], _TASK_FOLDERS] = Field(
        default_factory=dict,
        description="more named splits, split name -> dataset directory; may not repeat"
        " train or eval",
    )
    replay_dockerfile: bool | None = Field(
        default=None,
        description="replay the Dockerfile's RUN steps in the sandbox; unset: on for a"
        " Dockerfile base image, off for a task with a prebuilt docker_image",
    )
    verifier_user: str | None = Field(
        default=None,
        description="user the verifier runs as, overriding every task's [verifier].user",
    )
    reward_key: str | None = Field(
        default=None,
        min_length=1,
        description="named reward of each task's reward.json to train on, overriding every"
        " task's [verifier].reward_key",
    )
    limit: int | None = Field(
        default=None, ge=1, description="keep only the first N tasks of each split (by id)"
    )

    @model_validator(mode="after")
    def _no_repeated_split(self) -> HarborConfig:
        repeated = sorted({"train", "eval"} & set(self.splits))
        if repeated:
            raise ValueError(
                f"splits repeats {', '.join(repeated)}: set those with path and eval_path"
            )
        return self


@hookimpl
def rllm_task_sources() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="task_source",
        name="harbor",
        factory=lazy("rllm_task_source_harbor.source:HarborTaskSource"),
        config=HarborConfig,
        summary="Harbor-format task directories graded by each task's tests/test.sh",
    )
