"""Entry module: the config of ``[sandbox] name = "daytona"`` and its spec.

Imports only rllm-core, pydantic and the standard library; the daytona SDK loads when a plan
builds the backend.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ConfigDict, Field
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings

__all__ = ["DaytonaSandboxConfig"]


class DaytonaSandboxConfig(RetrySettings):
    """Keys of ``[sandbox] name = "daytona"``.

    ``retries``, ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of a
    creation, file transfer, poll or delete that failed with a transient error (connection,
    5xx, rate limit); commands are never retried.

    Credentials left unset are read by the SDK from ``DAYTONA_API_KEY``, ``DAYTONA_API_URL``
    and ``DAYTONA_TARGET`` when the first sandbox is created.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key: str | None = Field(
        default=None, description="Daytona API key; unset reads DAYTONA_API_KEY"
    )
    api_url: str | None = Field(
        default=None, description="Daytona API URL; unset reads DAYTONA_API_URL or the SDK default"
    )
    target: str | None = Field(
        default=None, description="region to create sandboxes in; unset reads DAYTONA_TARGET"
    )
    snapshot: str | None = Field(
        default=None,
        description="snapshot for specs that name neither an image nor a Dockerfile; unset uses"
        " Daytona's default snapshot",
    )
    build_dockerfiles: bool = Field(
        default=True,
        description="build a task's Dockerfile in Daytona when its task source can replay it"
        " on the FROM image instead (Harbor tasks); false boots the FROM image (or the"
        " snapshot mapped to it) and the task source replays the RUN and COPY steps",
    )
    snapshots: dict[str, str] = Field(
        default_factory=dict,
        description="image -> prebuilt snapshot name; a mapped image starts from the snapshot"
        " (no build; the snapshot's own resources apply)",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="labels added to every sandbox, below the spec's own"
    )
    run_label: str | None = Field(
        default=None,
        description="value of the 'rllm-run' label on every sandbox of this backend; unset picks"
        " a fresh id per backend, so cleanup() finds exactly this run's sandboxes",
    )
    session_threshold_s: float = Field(
        default=60.0,
        ge=0,
        description="commands whose timeout exceeds this run as asynchronous session commands"
        " that are polled, since Daytona drops idle connections on long calls",
    )
    poll_interval_s: float = Field(
        default=1.0, gt=0, description="seconds between polls of a session command"
    )
    output_limit_bytes: int = Field(
        default=1 << 20,
        gt=0,
        description="bytes of merged output kept per command; the rest is dropped inside the"
        " sandbox and the result is marked truncated",
    )
    create_timeout_s: float = Field(
        default=600.0, gt=0, description="how long one sandbox may take to build and start"
    )
    auto_stop_minutes: int = Field(
        default=15,
        ge=0,
        description="idle minutes after which Daytona stops (and then deletes) a sandbox;"
        " 0 disables the idle stop and leaves only the lifetime",
    )
    max_concurrent_creates: int = Field(
        default=8, ge=1, description="creations in flight at once, per backend"
    )
    create_interval_s: float = Field(
        default=0.25,
        ge=0.0,
        description="least time between two sandbox creation requests from this backend"
        " (0 disables the limit)",
    )


@hookimpl
def rllm_sandbox_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sandbox_backend",
        name="daytona",
        factory=lazy("rllm_sandbox_backend_daytona.backend:DaytonaBackend"),
        config=DaytonaSandboxConfig,
        summary="Daytona cloud sandboxes through the daytona SDK (merged stdout/stderr)",
        traits={"remote": True},
        credentials=(
            Credential(
                what="Daytona API key",
                env=("DAYTONA_API_KEY",),
                key="api_key",
                also_env=(("DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"),),
            ),
        ),
    )
