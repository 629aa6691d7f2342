"""Entry module of rllm-sample-buffer-object-store: the config model and the spec the registry
hook yields.

Imports only rllm-core, pydantic and the standard library; the implementation
(:mod:`rllm_sample_buffer_object_store.buffer`) loads when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.ports import ObjectStore

__all__ = ["ObjectStoreSampleBufferConfig"]


class ObjectStoreSampleBufferConfig(BaseModel):
    """Keys of ``[sample_buffer] name = "object-store"``."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    store: Any = Field(
        default=None,
        description="the object store the buffer lives in: a run gives it the plan's"
        " [object_store] (not a plan key)",
        exclude=True,
    )
    prefix: str = Field(
        default="buffer",
        description="key prefix of the buffer's objects in the store; a run sets"
        " runs/<[run].name>/buffer, where its sampler and trainer meet",
    )
    writer: str | None = Field(
        default=None,
        description="this process's shard of payload keys (one key segment); a random one"
        " when unset",
    )
    missing_payload_timeout_s: float = Field(
        default=30.0,
        ge=0.0,
        description="seconds a reader waits for a payload its index names before it skips"
        " the position for good",
    )
    compress: bool = Field(
        default=False,
        description="store payloads zstandard-compressed (needs the zstandard package to"
        " write and to read them)",
    )

    @field_validator("store")
    @classmethod
    def _a_built_store(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, ObjectStore):
            raise ValueError(
                "the store is the run's [object_store], not a plan key; remove"
                " [sample_buffer].store and add an [object_store] section"
            )
        return value


@hookimpl
def rllm_sample_buffers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sample_buffer",
        name="object-store",
        traits={"run_keys": ("store", "prefix")},
        factory=lazy("rllm_sample_buffer_object_store.buffer:ObjectStoreSampleBuffer.from_config"),
        config=ObjectStoreSampleBufferConfig,
        summary="samples in the run's [object_store] (a folder, S3): many writers, one trainer",
    )
