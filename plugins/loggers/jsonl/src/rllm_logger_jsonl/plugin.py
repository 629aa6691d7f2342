"""Entry module of rllm-logger-jsonl: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the implementation
(:mod:`rllm_logger_jsonl.logger`) loads when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["JsonlLoggerConfig"]


class JsonlLoggerConfig(BaseModel):
    """Keys of a ``[[loggers]] name = "jsonl"`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="file that receives one JSON object per line; appended to when it exists"
    )


@hookimpl
def rllm_loggers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="logger",
        name="jsonl",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_logger_jsonl.logger:JsonlLogger.from_config"),
        config=JsonlLoggerConfig,
        summary="one JSON object per metrics step or event, appended to a file",
    )
