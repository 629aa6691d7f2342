"""The ``s3`` object store: one S3 object per key, under ``prefix/`` in a bucket.

Requests go through botocore (boto3's core) on a session that reads no AWS config file,
profile, credential chain or configured endpoint: the plan's keys and the environment
variables they name are the whole configuration. botocore's own retries are off; each call is
retried here, through :func:`rllm_core.kit.retry.retry_sync`, when it failed transiently.

- ``put`` is one PutObject: S3 stores an object whole or not at all, and an object it
  acknowledged is durable.
- ``put_if_absent`` is a PutObject with ``If-None-Match: *``. S3 answers 412 when the key
  exists (the call returns ``False``) and 409 ``ConditionalRequestConflict`` while another
  conditional write to the key is in flight (the call is retried, as S3 asks). Each call tags
  its object with a random id in user metadata, so that when an attempt's answer was lost and
  the retry finds the key taken, one HEAD tells whether the object there is this call's own.
- ``list`` is ListObjectsV2 with ``Prefix`` and ``StartAfter``, page by page.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.handlers import add_expect_header
from rllm_core.errors import ObjectNotFoundError, PlanError, PlanIssue, StorageError
from rllm_core.kit.retry import RetrySettings, retry_sync
from rllm_core.storage.keys import check_key

if TYPE_CHECKING:
    from rllm_object_store_s3.plugin import S3ObjectStoreConfig

__all__ = ["S3Credentials", "S3ObjectStore", "credentials_from_config"]

T = TypeVar("T")

PUT_ID = "rllm-put-id"
"""User metadata key (``x-amz-meta-rllm-put-id``) holding the id of the put_if_absent call
that created an object."""

_MAX_NAME_BYTES = 1024
_TRANSIENT_CODES = frozenset(
    {
        "ConditionalRequestConflict",
        "OperationAborted",
        "RequestTimeout",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
    }
)
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
    }
)


@dataclass(frozen=True)
class S3Credentials:
    """An access key; ``source`` says where it came from, for error messages."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    source: str = "the credentials given"


def credentials_from_config(config: S3ObjectStoreConfig) -> S3Credentials:
    """The credentials of a plan: each from its plan key, else from the environment variable
    its ``*_env`` key names. Raises :class:`~rllm_core.errors.PlanError` naming the variable to
    set when the access key id or the secret is missing."""
    access_key_id = config.access_key_id or os.environ.get(config.access_key_id_env, "")
    secret = (
        config.secret_access_key.get_secret_value()
        if config.secret_access_key is not None
        else os.environ.get(config.secret_access_key_env, "")
    )
    token = (
        config.session_token.get_secret_value()
        if config.session_token is not None
        else os.environ.get(config.session_token_env, "")
    )
    issues = []
    for value, key, env, what in (
        (access_key_id, "access_key_id", config.access_key_id_env, "an access key id"),
        (secret, "secret_access_key", config.secret_access_key_env, "a secret access key"),
    ):
        if not value:
            issues.append(
                PlanIssue(
                    path="plan",
                    section="object_store",
                    key=f"{key}_env",
                    value=env,
                    message=f"the S3 object store needs {what} and ${env} is not set",
                    hint=f"export {env}=<{what.split(' ', 1)[1]}>, or name another variable"
                    f" with {key}_env",
                )
            )
    if issues:
        raise PlanError(issues)
    sources = [
        "access_key_id in the plan" if config.access_key_id else f"${config.access_key_id_env}",
        "secret_access_key in the plan"
        if config.secret_access_key is not None
        else f"${config.secret_access_key_env}",
    ]
    if token:
        sources.append(
            "session_token in the plan"
            if config.session_token is not None
            else f"${config.session_token_env}"
        )
    return S3Credentials(
        access_key_id=access_key_id,
        secret_access_key=secret,
        session_token=token or None,
        source=" and ".join(sources),
    )


_session_lock = threading.Lock()
_shared_session: botocore.session.Session | None = None


def _session() -> botocore.session.Session:
    """The process's botocore session (making one loads S3's API model: about 0.1 s); call
    with ``_session_lock`` held, since a session is not thread-safe.

    Every variable that would make botocore read a file, a profile or a configured endpoint is
    pinned, so the plan alone decides where requests go and how they are signed.
    """
    global _shared_session
    if _shared_session is None:
        _shared_session = botocore.session.Session(
            session_vars={
                "profile": (None, None, None, None),
                "config_file": (None, None, os.devnull, None),
                "credentials_file": (None, None, os.devnull, None),
                "ignore_configured_endpoint_urls": (None, None, True, None),
            }
        )
    return _shared_session


class _Conflict(Exception):
    """S3 answered 409: another conditional write to the key is in flight."""


class S3ObjectStore:
    """An :class:`~rllm_core.ports.ObjectStore` in ``bucket``, every key under ``prefix/``.
    Thread-safe; any number of processes and machines may share a bucket and prefix.

    ``page_size`` is the most keys one ListObjectsV2 request returns (S3's limit is 1000).
    ``exists`` of a key in a missing bucket is ``False``: S3 answers the HEAD with a bare 404.
    """

    def __init__(
        self,
        bucket: str,
        *,
        credentials: S3Credentials,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        retry: RetrySettings | None = None,
        timeout_s: float = 60.0,
        page_size: int = 1000,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.rstrip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._credentials = credentials
        self._retry = retry or RetrySettings()
        self._page_size = page_size
        self._sleep = sleep
        self._where = endpoint_url or f"AWS S3 in {region}"
        with _session_lock:
            self._client = _session().create_client(
                "s3",
                region_name=region,
                endpoint_url=endpoint_url,
                aws_access_key_id=credentials.access_key_id,
                aws_secret_access_key=credentials.secret_access_key,
                aws_session_token=credentials.session_token,
                config=Config(
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    connect_timeout=timeout_s,
                    read_timeout=timeout_s,
                    max_pool_connections=32,
                    s3={"addressing_style": "path" if endpoint_url else "auto"},
                ),
            )
        # botocore holds every body back until the server answers "Expect: 100-continue": one
        # more round trip for each put, where the store's bodies are best sent at once.
        self._client.meta.events.unregister("before-call.s3", add_expect_header)

    @classmethod
    def from_config(cls, config: S3ObjectStoreConfig) -> S3ObjectStore:
        """Build from the validated plan config (the component factory)."""
        return cls(
            config.bucket,
            credentials=credentials_from_config(config),
            prefix=config.prefix,
            endpoint_url=config.endpoint_url,
            region=config.region,
            retry=RetrySettings(
                retries=config.retries,
                retry_backoff_s=config.retry_backoff_s,
                retry_backoff_max_s=config.retry_backoff_max_s,
            ),
            timeout_s=config.timeout_s,
        )

    # ---------------------------------------------------------------- the port

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there."""
        name = self._name(key)
        body = bytes(data)
        self._call(
            "put", key, lambda: self._client.put_object(Bucket=self.bucket, Key=name, Body=body)
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless an object is there; ``True`` when this call
        created it."""
        name = self._name(key)
        body = bytes(data)
        put_id = uuid.uuid4().hex
        may_have_landed = False

        def attempt() -> bool:
            nonlocal may_have_landed
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=body,
                    IfNoneMatch="*",
                    Metadata={PUT_ID: put_id},
                )
            except ClientError as exc:
                status = _status(exc)
                if status == 412:
                    return may_have_landed and self._holds(name, put_id)
                may_have_landed = True
                if status == 409:
                    raise _Conflict(_describe(exc)) from exc
                raise
            except BaseException:
                may_have_landed = True
                raise
            return True

        return self._call("put_if_absent", key, attempt)

    def get(self, key: str) -> bytes:
        name = self._name(key)

        def read() -> bytes:
            response = self._client.get_object(Bucket=self.bucket, Key=name)
            with response["Body"] as body:
                return body.read()

        return self._call("get", key, read)

    def exists(self, key: str) -> bool:
        name = self._name(key)

        def head() -> bool:
            try:
                self._client.head_object(Bucket=self.bucket, Key=name)
            except ClientError as exc:
                if _status(exc) == 404 and _code(exc) != "NoSuchBucket":
                    return False
                raise
            return True

        return self._call("exists", key, head)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is a no-op (S3 answers 204 either way)."""
        name = self._name(key)
        self._call("delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=name))

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Every key that starts with ``prefix`` (plain string prefix) and sorts after
        ``start_after``, sorted."""
        arguments: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self._base + prefix,
            "MaxKeys": self._page_size,
        }
        if start_after is not None and self._base + start_after:
            arguments["StartAfter"] = self._base + start_after
        keys: list[str] = []
        while True:
            page = self._call(
                "list", prefix, lambda: self._client.list_objects_v2(**arguments), listing=True
            )
            keys.extend(item["Key"][len(self._base) :] for item in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                break
            arguments["ContinuationToken"] = page["NextContinuationToken"]
        keys.sort()
        return keys

    def close(self) -> None:
        """Close the connections; the store cannot be used afterwards."""
        self._client.close()

    def __repr__(self) -> str:
        where = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r}{where})"

    # ---------------------------------------------------------------- helpers

    def _name(self, key: str) -> str:
        check_key(key)
        name = self._base + key
        if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
            raise ValueError(
                f"invalid object key {key!r}: with the prefix {self.prefix!r} it is longer than"
                f" the {_MAX_NAME_BYTES} bytes S3 allows in a key; shorten it"
            )
        return name

    def _holds(self, name: str, put_id: str) -> bool:
        """Whether the object under ``name`` was created by the put_if_absent call
        ``put_id`` (False when it is gone)."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=name)
        except ClientError as exc:
            if _status(exc) == 404:
                return False
            raise
        return head.get("Metadata", {}).get(PUT_ID) == put_id

    def _call(self, op: str, key: str, call: Callable[[], T], *, listing: bool = False) -> T:
        what = f"list of prefix {key!r}" if listing else f"{op} of key {key!r}"
        target = f"{what} in s3://{self.bucket}/{self._base} at {self._where}"
        try:
            return retry_sync(
                call, self._retry, transient=_is_transient, what=target, sleep=self._sleep
            )
        except _Conflict as exc:
            raise StorageError(
                f"{target}: other conditional writes to the key kept conflicting (HTTP 409)"
                f" through {self._retry.retries} retries: {exc}; retry later, or raise retries"
                " in [object_store]"
            ) from exc
        except ClientError as exc:
            raise self._translate(exc, target, op) from exc
        except BotoCoreError as exc:
            if not _is_transient(exc):
                raise StorageError(f"{target} failed: {exc}") from exc
            attempts = self._retry.retries + 1
            raise StorageError(
                f"{target} failed after {attempts} attempt(s): {exc}; check endpoint_url and"
                " the network, or raise retries in [object_store]"
            ) from exc

    def _translate(self, exc: ClientError, target: str, op: str) -> StorageError:
        status, code = _status(exc), _code(exc)
        if code == "NoSuchBucket" or (status == 404 and op == "list"):
            return StorageError(
                f"{target}: bucket {self.bucket!r} does not exist there; create it, or fix"
                " bucket (or endpoint_url) in [object_store]"
            )
        if status == 404 and op == "get":
            return ObjectNotFoundError(f"{target}: no object is stored under this key")
        if status == 403 or code in _CREDENTIAL_CODES or code == "AccessDenied":
            missing = (
                " (S3 also answers 403 for a missing key when the credentials may not list"
                " the bucket: grant s3:ListBucket)"
                if op in ("get", "exists")
                else ""
            )
            return StorageError(
                f"{target}: refused ({_describe(exc)}) for the credentials from"
                f" {self._credentials.source}{missing}; check those credentials and their"
                f" permissions on bucket {self.bucket!r}"
            )
        return StorageError(f"{target} failed: {_describe(exc)}")


def _status(exc: ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _describe(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    message = error.get("Message") or ""
    text = f"HTTP {_status(exc)} {_code(exc)}".rstrip()
    return f"{text}: {message}" if message else text


def _is_transient(exc: BaseException) -> bool:
    if isinstance(
        exc,
        _Conflict
        | BotoConnectionError
        | HTTPClientError
        | IncompleteReadError
        | FlexibleChecksumError,
    ):
        return True
    if isinstance(exc, ClientError):
        status = _status(exc) or 0
        return status >= 500 or status == 429 or _code(exc) in _TRANSIENT_CODES
    return False
