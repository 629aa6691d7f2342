"""Entry module: the config model and the spec of the ``local`` sandbox backend.

Imports only rllm-core, pydantic and the standard library; the backend loads when a plan
builds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["LocalSandboxConfig"]


class LocalSandboxConfig(BaseModel):
    """Keys of ``[sandbox] name = "local"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    isolation: Literal["auto", "bwrap", "none"] = Field(
        default="auto",
        description="'bwrap' isolates every sandbox with bubblewrap and fails creation when it"
        " cannot; 'none' runs plain subprocesses in a directory; 'auto' uses bubblewrap when it"
        " works and otherwise falls back to 'none' with a warning",
    )
    output_limit_bytes: int = Field(
        default=1 << 20,
        gt=0,
        description="bytes of stdout and of stderr kept per command; the rest is dropped and"
        " the result marked truncated",
    )
    root_dir: Path | None = Field(
        default=None,
        description="directory under which each sandbox gets its private root, removed on"
        " close; default: the system temporary directory",
    )
    extra_ro_binds: list[str] = Field(
        default_factory=list,
        description="more host paths that commands see read-only at the same path (bwrap"
        " only), for example a toolchain under /opt",
    )
    rlimits: bool = Field(
        default=True,
        description="apply the spec's memory_mb as the address-space limit and disk_mb as the"
        " largest file a command may write",
    )
    bwrap: str = Field(
        default="bwrap",
        description="the bubblewrap program, a name looked up on PATH or an absolute path",
    )
    start_delay_s: float = Field(
        default=0.0,
        ge=0,
        description="seconds every create waits (without using the CPU) before it hands out"
        " the sandbox: emulates a remote sandbox's start-up latency (as Modal or Daytona"
        " show) for benchmarks; 0 adds none",
    )
    exec_delay_s: float = Field(
        default=0.0,
        ge=0,
        description="seconds every command waits (without using the CPU) before it runs,"
        " outside its timeout: emulates a remote sandbox's per-command round trip for"
        " benchmarks; 0 adds none",
    )

    @field_validator("extra_ro_binds")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or path.rstrip("/") == "":
                raise ValueError(
                    f"extra_ro_binds entry {path!r} must be an absolute path other than '/'"
                )
        return paths


@hookimpl
def rllm_sandbox_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sandbox_backend",
        name="local",
        factory=lazy("rllm_sandbox_backend_local.backend:LocalBackend"),
        config=LocalSandboxConfig,
        summary="sandboxes on this machine: bubblewrap namespaces, or plain subprocesses",
    )
