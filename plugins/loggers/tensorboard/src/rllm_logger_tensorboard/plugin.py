"""Entry module: the config model and the spec of the ``tensorboard`` logger.

Imports only rllm-core, pydantic and the standard library; tensorboard loads when a plan builds
the logger.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["TensorboardLoggerConfig"]


class TensorboardLoggerConfig(BaseModel):
    """Keys of a ``[[loggers]] name = "tensorboard"`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="log directory that receives the event files (`tensorboard --logdir` it);"
        " created when missing, each logger adds a new file"
    )


@hookimpl
def rllm_loggers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="logger",
        name="tensorboard",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_logger_tensorboard.logger:TensorboardLogger.from_config"),
        config=TensorboardLoggerConfig,
        summary="TensorBoard event files: metrics as scalars, events as text",
    )
