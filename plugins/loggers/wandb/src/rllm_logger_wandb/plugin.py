"""Entry module: the config model and the spec of the ``wandb`` logger.

Imports only rllm-core, pydantic and the standard library; wandb loads when a plan builds the
logger.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, Credential, hookimpl, lazy

__all__ = ["WandbLoggerConfig"]


class WandbLoggerConfig(BaseModel):
    """Keys of a ``[[loggers]] name = "wandb"`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="folder that receives wandb's files (its `wandb/` folder, holding"
        " `offline-run-*/`); created when missing; a training run fills `<run>/logs/wandb`"
        " (building the logger in Python without it: WANDB_DIR, else the working directory)"
    )
    mode: Literal["offline", "online", "disabled"] = Field(
        default="offline",
        description='"offline" writes the run under `path` only (upload it later with `wandb'
        ' sync`); "online" streams it to the W&B server (needs `wandb login` or'
        ' WANDB_API_KEY); "disabled" writes nothing. Wins over WANDB_MODE',
    )
    project: str | None = Field(
        default=None, description="W&B project; unset: WANDB_PROJECT, else wandb's default"
    )
    entity: str | None = Field(
        default=None, description="W&B user or team; unset: WANDB_ENTITY, else the login's"
    )
    name: str | None = Field(
        default=None, description="display name of the run; unset: wandb picks one"
    )
    tags: tuple[str, ...] = Field(default=(), description="tags of the run")
    group: str | None = Field(default=None, description="group that gathers several runs")


@hookimpl
def rllm_loggers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="logger",
        name="wandb",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_logger_wandb.logger:WandbLogger.from_config"),
        config=WandbLoggerConfig,
        summary="a Weights & Biases run (offline by default): metrics history and events",
        credentials=(
            Credential(
                what="W&B API key",
                env=("WANDB_API_KEY",),
                files=("~/.netrc",),
                login="wandb login",
                when={"mode": "online"},
            ),
        ),
    )
