"""Entry module: the config of the ``modal`` sandbox backend and its spec.

Imports only rllm-core, pydantic and the standard library; the modal SDK loads when a plan
builds the backend.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ConfigDict, Field
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings

__all__ = ["ModalConfig"]


class ModalConfig(RetrySettings):
    """Keys of ``[sandbox] name = "modal"``.

    ``retries``, ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of creation,
    file and lifecycle calls that failed transiently (connection lost, 5xx, rate limited);
    commands are never retried, since they may not be idempotent.

    Credentials come from the modal SDK's own configuration (``MODAL_TOKEN_ID`` and
    ``MODAL_TOKEN_SECRET``, or ``~/.modal.toml``); they are never plan keys.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    app_name: str = Field(
        default="rllm-sandboxes",
        min_length=1,
        max_length=63,
        description="Modal app the sandboxes belong to; looked up, and created when missing",
    )
    environment_name: str | None = Field(
        default=None, description="Modal environment of the app; the SDK's default when unset"
    )
    run_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]{1,63}$",
        description="value of the rllm-run tag put on every sandbox, so that a run's leaked"
        " sandboxes can be found and terminated; a fresh random id when unset",
    )
    default_image: str | None = Field(
        default=None,
        description="registry image for specs that name neither an image nor a Dockerfile;"
        " Modal's debian_slim image when unset",
    )
    output_limit_bytes: int = Field(
        default=1 << 20,
        gt=0,
        description="bytes of each output stream kept per command; the rest is read and"
        " dropped, and the result is marked truncated",
    )
    create_interval_s: float = Field(
        default=0.2,
        ge=0.0,
        description="least time between two sandbox creation requests from this backend"
        " (0 disables the limit)",
    )
    idle_timeout_s: int | None = Field(
        default=None,
        gt=0,
        description="terminate a sandbox that has been idle this long; no idle limit when unset",
    )
    region: str | None = Field(default=None, description="Modal region to run sandboxes in")
    kill_timeout_s: float = Field(
        default=15.0,
        gt=0.0,
        description="how long killing a timed-out command's process group may take",
    )


@hookimpl
def rllm_sandbox_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sandbox_backend",
        name="modal",
        factory=lazy("rllm_sandbox_backend_modal.backend:ModalBackend"),
        config=ModalConfig,
        summary="Modal cloud sandboxes through the modal SDK, with retries and per-run tags",
        traits={"remote": True},
        credentials=(
            Credential(
                what="Modal token",
                env=("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),
                files=("~/.modal.toml",),
                login="modal token set",
            ),
        ),
    )
