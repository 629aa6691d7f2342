"""Entry module: the configs of the ``modal`` sandbox backend and the ``modal`` trainer
launcher, and their specs.

Imports only rllm-core, pydantic and the standard library; the modal SDK loads when a plan
builds the backend or the launcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings
from rllm_core.ports import ObjectStore

__all__ = ["ModalConfig", "ModalLauncherConfig"]

MODAL_TOKEN = Credential(
    what="Modal token",
    env=("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),
    files=("~/.modal.toml",),
    login="modal token set",
)


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
        credentials=(MODAL_TOKEN,),
    )


class ModalLauncherConfig(BaseModel):
    """Keys of ``[scheduler] launcher = { name = "modal", image = "..." }``: each trainer
    incarnation runs in a Modal sandbox of its own (:mod:`rllm_sandbox_backend_modal.launcher`).

    Credentials come from the modal SDK's own configuration, as for the sandbox backend.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    store: Any = Field(
        default=None,
        description="the object store the launched job reads its command file from and meets"
        " the scheduler in: a run gives it the plan's [object_store] (not a plan key)",
        exclude=True,
    )
    image: str = Field(
        min_length=1,
        description="registry image the trainer runs in; it must hold rllm-core, the plan's"
        " plugins and the credentials of the run's object store",
    )
    gpu: str | None = Field(
        default=None,
        min_length=1,
        description="Modal GPU of each trainer sandbox (`A100`, `H100:2`); none when unset",
    )
    app_name: str = Field(
        default="rllm-trainers",
        min_length=1,
        max_length=63,
        description="Modal app the trainer sandboxes belong to; looked up, and created when"
        " missing",
    )
    environment_name: str | None = Field(
        default=None, description="Modal environment of the app; the SDK's default when unset"
    )
    timeout_s: int = Field(
        default=24 * 3600,
        gt=0,
        description="longest life of one trainer sandbox in seconds (Modal's own limit applies)",
    )
    plan_path: str = Field(
        default="/tmp/rllm-trainer/plan.toml",
        min_length=1,
        description="where the command file's plan is written inside the sandbox",
    )

    @field_validator("store")
    @classmethod
    def _a_built_store(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, ObjectStore):
            raise ValueError(
                "the store is the run's [object_store], not a plan key; remove"
                " [scheduler].launcher.store and add an [object_store] section"
            )
        return value


@hookimpl
def rllm_trainer_launchers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="trainer_launcher",
        name="modal",
        factory=lazy("rllm_sandbox_backend_modal.launcher:ModalTrainerLauncher.from_config"),
        config=ModalLauncherConfig,
        summary="each trainer incarnation in a Modal sandbox of its own, on a Modal GPU",
        traits={"run_keys": ("store",)},
        credentials=(MODAL_TOKEN,),
    )
