"""Entry module: the config models and the specs of the two trace stores.

Imports only rllm-core, pydantic and the standard library; the implementations (and zstandard)
load when a plan builds a component.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, NoConfig, hookimpl, lazy

__all__ = ["DeltaChainConfig"]


class DeltaChainConfig(BaseModel):
    """Keys of ``[trace_store] name = "deltachain"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="directory holding the segment files and the lock file; created when missing"
    )
    snapshot_every: int = Field(
        default=0,
        ge=0,
        description="store a record's full prompt beside its delta once it is this many records"
        " below its root or the last snapshot, so that reading one trace walks at most that many"
        " records; 0 stores no snapshots (each costs a full prompt on disk)",
    )
    segment_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=4096,
        description="start a new segment file once the current one would grow past this size",
    )
    compression_level: int = Field(
        default=3,
        ge=1,
        le=22,
        description="zstd level for each record; higher levels write slower and save little on"
        " token ids",
    )
    fsync: bool = Field(
        default=False,
        description="fdatasync every append before returning; without it an acknowledged trace"
        " survives a killed process but not a power loss",
    )


@hookimpl
def rllm_trace_stores() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="trace_store",
        name="deltachain",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_trace_store_deltachain.store:DeltaChainTraceStore.from_config"),
        config=DeltaChainConfig,
        summary="append-only zstd-compressed segment files; a torn tail is cut on open",
    )
    yield ComponentSpec(
        kind="trace_store",
        name="memory",
        factory=lazy("rllm_trace_store_deltachain.memory:MemoryTraceStore.from_config"),
        config=NoConfig,
        summary="in-process delta chains, gone when the process ends",
    )
