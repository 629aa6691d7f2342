"""Entry module of rllm-object-store-s3: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the implementation
(:mod:`rllm_object_store_s3.objects`, which loads botocore) loads when a plan builds the
component.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ConfigDict, Field, SecretStr, field_validator
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings
from rllm_core.storage.keys import check_key

__all__ = ["S3ObjectStoreConfig"]

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class S3ObjectStoreConfig(RetrySettings):
    """Keys of ``[object_store] name = "s3"``.

    Credentials come from the plan (``access_key_id`` and ``secret_access_key``, with
    ``session_token`` for temporary ones) or, for each one the plan leaves unset, from the
    environment variable its ``*_env`` key names; never from AWS config files, profiles or
    instance metadata. Secrets written in a plan travel with it (into run records too), so
    prefer the environment variables outside a local test endpoint.

    ``retries``, ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of a call
    that failed transiently (a connection error, a timeout, a 5xx or throttling answer).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$",
        description="bucket holding the objects; it must exist",
    )
    prefix: str = Field(
        "",
        description="folder inside the bucket under which every key is stored ('runs/q' stores"
        " key 'a/b' as 'runs/q/a/b'); empty stores keys at the top of the bucket",
    )
    endpoint_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+",
        description="S3 API endpoint, e.g. http://127.0.0.1:9000 for MinIO or"
        " https://ACCOUNT_ID.r2.cloudflarestorage.com for R2; unset uses AWS S3 in `region`",
    )
    region: str = Field(
        "us-east-1",
        pattern=r"^[a-z0-9-]+$",
        description="region the requests are signed for ('auto' for R2)",
    )
    access_key_id: str | None = Field(
        None, description="access key id; unset reads the variable access_key_id_env names"
    )
    secret_access_key: SecretStr | None = Field(
        None,
        description="secret access key; unset reads the variable secret_access_key_env names",
    )
    session_token: SecretStr | None = Field(
        None,
        description="session token of temporary credentials; unset reads the variable"
        " session_token_env names, and none is sent when that is unset too",
    )
    access_key_id_env: str = Field(
        "AWS_ACCESS_KEY_ID",
        pattern=_ENV_NAME,
        description="environment variable holding the access key id",
    )
    secret_access_key_env: str = Field(
        "AWS_SECRET_ACCESS_KEY",
        pattern=_ENV_NAME,
        description="environment variable holding the secret access key",
    )
    session_token_env: str = Field(
        "AWS_SESSION_TOKEN",
        pattern=_ENV_NAME,
        description="environment variable holding the session token (optional)",
    )
    timeout_s: float = Field(
        60.0, gt=0, description="seconds to wait for a connection, and for each read of an answer"
    )

    @field_validator("prefix")
    @classmethod
    def _folder(cls, value: str) -> str:
        folder = value.rstrip("/")
        if folder:
            try:
                check_key(folder)
            except ValueError as exc:
                raise ValueError(
                    f"prefix {value!r} is not a folder path like 'runs/q': {exc}"
                ) from None
        return folder


@hookimpl
def rllm_object_stores() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="object_store",
        name="s3",
        factory=lazy("rllm_object_store_s3.objects:S3ObjectStore.from_config"),
        config=S3ObjectStoreConfig,
        summary="objects in an S3 bucket (AWS, MinIO, R2); create-if-absent by conditional write",
        credentials=(
            Credential(
                what="S3 access key id",
                env=("AWS_ACCESS_KEY_ID",),
                key="access_key_id",
                env_key="access_key_id_env",
            ),
            Credential(
                what="S3 secret access key",
                env=("AWS_SECRET_ACCESS_KEY",),
                key="secret_access_key",
                env_key="secret_access_key_env",
            ),
        ),
    )
