"""Entry module of rllm-object-store-file: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the implementation
(:mod:`rllm_object_store_file.objects`) loads when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["FileObjectStoreConfig"]


class FileObjectStoreConfig(BaseModel):
    """Keys of ``[object_store] name = "file"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path = Field(
        description="directory holding the objects (under objects/) and in-flight writes"
        " (under tmp/); created when missing"
    )


@hookimpl
def rllm_object_stores() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="object_store",
        name="file",
        factory=lazy("rllm_object_store_file.objects:FileObjectStore.from_config"),
        config=FileObjectStoreConfig,
        summary="one file per key under a directory, written atomically and fsynced",
    )
