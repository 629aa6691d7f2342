"""Requests to a managed training service (Tinker, Fireworks), sent with bounded retries.

The managed trainer backends train and sample on a remote service whose SDK answers each
request with a future. :class:`ServiceCalls` waits for that future at most
``request_timeout_s``, sends a request again while it fails transiently, and counts the
retries: a training call appends each retry's number to the list it is given, a sampling
request adds to a counter that the next optimizer step takes. Which errors are transient is
the SDK's business; :func:`retryable_status` (408, 429, 5xx) and :func:`retry_after_s` (a
``Retry-After`` header) are what every such SDK's classification shares.

A request that changes the training run (a ``forward_backward`` that adds gradients, an
``optim_step``) may have reached the service when its answer is lost to a broken TLS stream
or a timeout; sending it again could count a gradient or a step twice, so only the SDK's own
classification retries it. A request that reads or writes the same thing however often it
runs (sampling, scoring logprobs, saving weights or a checkpoint under its name, loading one)
is *idempotent*: for it :func:`lost_answer` (an ``ssl.SSLError`` or a timeout, the wait past
``request_timeout_s`` included, anywhere in the error's causes) is transient too.

:class:`ManagedServiceSettings` holds the config keys these calls read; a backend's config
model subclasses it.
"""

from __future__ import annotations

import ssl
import threading
import warnings
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, TypeVar

from pydantic import Field, model_validator

from rllm_core.kit.retry import RetrySettings, retry_async, retry_sync

__all__ = [
    "ManagedServiceSettings",
    "ServiceCalls",
    "lost_answer",
    "retry_after_s",
    "retryable_status",
    "service_metrics",
]

T = TypeVar("T")

_RETRYABLE = frozenset({408, 429})


class ManagedServiceSettings(RetrySettings):
    """The retry keys of :class:`~rllm_core.kit.retry.RetrySettings` and the longest wait for
    one request.

    A subclass with a ``model`` key (the model the service trains, the key every trainer
    backend names its model with) also accepts that key's old name ``base_model`` until the
    next release, with a ``DeprecationWarning`` saying to rename it; both at once are refused.
    """

    request_timeout_s: float = Field(
        900.0,
        gt=0.0,
        description=(
            "Longest wait for one request to the training service (forward_backward,"
            " optim_step, publishing weights, saving or loading a checkpoint) before it fails"
            " with TimeoutError; a request that changes the training run (forward_backward,"
            " optim_step) is then not sent again, a read or a save under its name is retried."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_base_model(cls, data: Any) -> Any:
        if (
            not isinstance(data, dict)
            or "base_model" not in data
            or "model" not in cls.model_fields
        ):
            return data
        if "model" in data:
            raise ValueError(
                "both model and base_model are set; base_model is the old name of model:"
                " remove base_model"
            )
        warnings.warn(
            f"base_model is the old name of model and is accepted until the next release;"
            f" rename the key: model = {data['base_model']!r}",
            DeprecationWarning,
            stacklevel=2,
        )
        renamed = {key: value for key, value in data.items() if key != "base_model"}
        renamed["model"] = data["base_model"]
        return renamed


def retryable_status(status: int | None) -> bool:
    """True for an HTTP status worth retrying: 408 (request timeout), 429 (rate limit), 5xx."""
    return status is not None and (status in _RETRYABLE or status >= 500)


def lost_answer(error: BaseException) -> bool:
    """True when ``error``, or an error it was raised from, is an ``ssl.SSLError`` or a
    ``TimeoutError`` (``socket.timeout`` and ``asyncio.TimeoutError`` are that class): the
    answer was lost, and the request may or may not have run on the service."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError | TimeoutError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def retry_after_s(error: BaseException) -> float | None:
    """The seconds an answer's ``Retry-After`` header asks for, when ``error`` carries an
    HTTP response (``error.response.headers``) with one that is a number."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except (TypeError, ValueError):
        return None


def service_metrics(
    figures: Mapping[str, Any] | None, prefix: str, *, besides: Collection[str] = ()
) -> dict[str, float]:
    """The numeric ``figures`` a service answered with, each named ``<prefix>/<name>``, leaving
    out the names in ``besides`` (those the backend reports itself)."""
    return {
        f"{prefix}/{key}": float(value)
        for key, value in (figures or {}).items()
        if key not in besides and isinstance(value, int | float)
    }


class ServiceCalls:
    """Sends one backend's requests to its service ``service`` (a name for messages).

    ``transient`` tells the errors worth sending again; an idempotent request (see the module
    docstring; sampling always is) is also sent again after :func:`lost_answer`. ``hint``
    reads the wait a failed answer asks for. Safe to use from the sampler's event loop and
    the trainer's thread at once.
    """

    def __init__(
        self,
        service: str,
        settings: ManagedServiceSettings,
        *,
        transient: Callable[[BaseException], bool],
        hint: Callable[[BaseException], float | None] = retry_after_s,
    ) -> None:
        self.service = service
        self.settings = settings
        self._transient = transient
        self._hint = hint
        self._lock = threading.Lock()
        self._sampler_retries = 0

    def call(
        self,
        submit: Callable[[], Any],
        what: str,
        retries: list[int] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any:
        """Submit a request with ``submit()`` (which returns a future) and wait for its
        result, submitting again while it fails transiently; each retry's number is appended
        to ``retries``. ``idempotent`` says running the request twice does what running it
        once does: a lost answer (a TLS error, a timeout) is then retried too."""
        timeout = self.settings.request_timeout_s

        def once() -> Any:
            future = submit()
            try:
                return future.result(timeout=timeout)
            except TimeoutError as exc:
                raise TimeoutError(
                    f"{self.service} did not finish {what} within {timeout} s; raise"
                    f" request_timeout_s in [trainer] or check {self.service}'s status"
                ) from exc

        return retry_sync(
            once,
            self.settings,
            transient=self._idempotent_transient if idempotent else self._transient,
            what=f"{self.service} {what}",
            hint=self._hint,
            on_retry=None if retries is None else lambda n, error, wait: retries.append(n),
        )

    async def sample(self, once: Callable[[], Awaitable[T]], what: str) -> T:
        """Await ``once()``, calling it again while it fails transiently or its answer was
        lost (a sampling request changes nothing on the service); each retry is counted for
        :meth:`take_sampler_retries`."""
        return await retry_async(
            once,
            self.settings,
            transient=self._idempotent_transient,
            what=f"{self.service} {what}",
            hint=self._hint,
            on_retry=lambda n, error, wait: self._note_sampler_retry(),
        )

    def _idempotent_transient(self, error: BaseException) -> bool:
        return self._transient(error) or lost_answer(error)

    def take_sampler_retries(self) -> int:
        """The sampling retries since the previous call, and start counting from 0."""
        with self._lock:
            count, self._sampler_retries = self._sampler_retries, 0
        return count

    def _note_sampler_retry(self) -> None:
        with self._lock:
            self._sampler_retries += 1
