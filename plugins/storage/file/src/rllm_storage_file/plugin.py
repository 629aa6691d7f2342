"""Entry module: the config models and the specs of the three components.

Imports only rllm-core, pydantic and the standard library; the implementations load when a
plan builds a component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import LoggerSpec, ObjectStoreSpec, SampleBufferSpec, hookimpl, lazy

__all__ = ["FileObjectStoreConfig", "FileSampleBufferConfig", "JsonlLoggerConfig"]


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


class FileObjectStoreConfig(BaseModel):
    """Keys of ``[object_store] name = "file"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path = Field(
        description="directory holding the objects (under objects/) and in-flight writes"
        " (under tmp/); created when missing"
    )


class JsonlLoggerConfig(BaseModel):
    """Keys of a ``[[loggers]] name = "jsonl"`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="file that receives one JSON object per line; appended to when it exists"
    )


@hookimpl
def rllm_sample_buffers() -> Iterator[SampleBufferSpec]:
    yield SampleBufferSpec(
        name="file",
        factory=lazy("rllm_storage_file.buffer:FileSampleBuffer.from_config"),
        config=FileSampleBufferConfig,
        summary="append-only checksummed log in a directory; acknowledged samples survive kill -9",
    )


@hookimpl
def rllm_object_stores() -> Iterator[ObjectStoreSpec]:
    yield ObjectStoreSpec(
        name="file",
        factory=lazy("rllm_storage_file.objects:FileObjectStore.from_config"),
        config=FileObjectStoreConfig,
        summary="one file per key under a directory, written atomically and fsynced",
    )


@hookimpl
def rllm_loggers() -> Iterator[LoggerSpec]:
    yield LoggerSpec(
        name="jsonl",
        factory=lazy("rllm_storage_file.jsonl_logger:JsonlLogger.from_config"),
        config=JsonlLoggerConfig,
        summary="one JSON object per metrics step or event, appended to a file",
    )
