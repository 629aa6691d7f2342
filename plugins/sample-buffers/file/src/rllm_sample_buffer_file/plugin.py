"""Entry module of rllm-sample-buffer-file: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the implementation
(:mod:`rllm_sample_buffer_file.buffer`) loads when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["FileSampleBufferConfig"]


class FileSampleBufferConfig(BaseModel):
    """Keys of ``[sample_buffer] name = "file"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="directory holding the sample log and the committed watermark;"
        " created when missing"
    )
    fsync: bool = Field(
        default=True,
        description="fsync every append and commit before returning; with false an"
        " acknowledged sample survives a killed process but not a power loss",
    )


@hookimpl
def rllm_sample_buffers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sample_buffer",
        name="file",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_sample_buffer_file.buffer:FileSampleBuffer.from_config"),
        config=FileSampleBufferConfig,
        summary="append-only checksummed log in a directory; acknowledged samples survive kill -9",
    )
