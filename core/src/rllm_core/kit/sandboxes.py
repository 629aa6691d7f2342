"""What every sandbox backend does alike, whatever service runs its sandboxes.

- :class:`ClosesOnExit`: ``async with sandbox:`` closes the sandbox however the block ends;
  every sandbox class inherits it next to its own ``close``.
- :class:`ErrorMap`: which of a service SDK's exceptions become which rllm-core sandbox error
  (auth, file not found, gone, command timeout, transient; anything else a create error while
  creating, a plain ``SandboxError`` otherwise), each message naming the call, the SDK's
  exception and what to do.
- :func:`retry_transient`: :func:`rllm_core.kit.retry.retry_async` over calls that raise
  rllm-core sandbox errors, retrying ``SandboxTransientError`` and saying, when the retries
  run out, after how many attempts and what to do.
- :func:`command_timed_out`: the error of a command killed at its timeout.
- :func:`listing`: ``list_files``' answer from a service's directory entries.
- :func:`remote_gateway`: what a service's outbound allow list must hold for a sandbox with
  ``network = "gateway"`` to reach the gateway and nothing else it can name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import posixpath
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, TypeVar
from urllib.parse import urlsplit

from rllm_core.addresses import is_local_only
from rllm_core.errors import (
    SandboxAuthError,
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
    SandboxTransientError,
)
from rllm_core.kit.retry import Hint, RetrySettings, retry_async
from rllm_core.types import FileInfo, NetworkPolicy, SandboxSpec

__all__ = [
    "ClosesOnExit",
    "ErrorMap",
    "RemoteGateway",
    "command_timed_out",
    "listing",
    "remote_gateway",
    "retry_transient",
]

T = TypeVar("T")
Exceptions = tuple[type[BaseException], ...]


class _Closable(Protocol):
    async def close(self) -> None: ...


class ClosesOnExit:
    """``async with`` support for a class with an async ``close``: entering gives the object,
    leaving closes it."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self: _Closable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


@dataclass(frozen=True, slots=True)
class ErrorMap:
    """How the SDK of ``service`` fails, in the rllm-core sandbox error taxonomy.

    Each tuple holds SDK (or builtin) exception classes; the first of ``auth``,
    ``file_not_found``, ``gone``, ``command_timeout`` and ``transient`` that holds the
    exception's class decides the error. ``auth_hint`` says where the credentials come from,
    ``create_hint`` what to check when a creation fails otherwise.
    """

    service: str
    auth_hint: str
    create_hint: str
    auth: Exceptions = ()
    file_not_found: Exceptions = ()
    gone: Exceptions = ()
    command_timeout: Exceptions = ()
    transient: Exceptions = ()

    def detail(self, exc: BaseException, what: str) -> str:
        """The start of every message: the call (``what``) and the SDK's exception."""
        return f"{what}: {self.service} raised {type(exc).__name__}: {exc}"

    def translate(self, exc: BaseException, what: str, *, creating: bool = False) -> SandboxError:
        """The rllm-core error for ``exc``, raised by the SDK during ``what`` (the operation
        and its target, such as ``"read_file /app/x"``); the caller raises it ``from exc``.
        An rllm-core error comes back as it is."""
        if isinstance(exc, SandboxError):
            return exc
        detail = self.detail(exc, what)
        rules: tuple[tuple[Exceptions, type[SandboxError], str], ...] = (
            (self.auth, SandboxAuthError, self.auth_hint),
            (self.file_not_found, SandboxFileNotFound, "the path does not exist in the sandbox"),
            (
                self.gone,
                SandboxGone,
                "the sandbox was terminated or its lifetime ran out; create a new one",
            ),
            (
                self.command_timeout,
                SandboxCommandTimeout,
                "raise the timeout or shorten the command",
            ),
            (self.transient, SandboxTransientError, "the call may succeed when retried"),
        )
        for classes, error, hint in rules:
            if isinstance(exc, classes):
                return error(f"{detail}; {hint}")
        if creating:
            return SandboxCreateError(f"{detail}; {self.create_hint}")
        return SandboxError(detail)


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, SandboxTransientError)


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    settings: RetrySettings,
    *,
    what: str,
    hint: Hint | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``call()`` (which raises rllm-core sandbox errors), retrying a
    ``SandboxTransientError`` up to ``settings.retries`` times. When they run out, the last
    one is raised with the attempt count and what to do added, its SDK error as
    ``__cause__``; any other error is raised at once."""
    try:
        return await retry_async(
            call, settings, transient=_is_transient, what=what, hint=hint, sleep=sleep
        )
    except SandboxTransientError as exc:
        if settings.retries == 0:
            raise
        raise SandboxTransientError(
            f"{exc} (gave up after {settings.retries + 1} attempts; raise `retries` in the"
            " [sandbox] config or try again later)"
        ) from (exc.__cause__ or exc)


def command_timed_out(command: str, timeout: float, where: str = "") -> SandboxCommandTimeout:
    """The error of ``command``, run ``where`` (``"in modal sandbox sb-1"``; unset names no
    place), whose process group was killed when it ran past ``timeout`` seconds."""
    place = f" {where}" if where else ""
    return SandboxCommandTimeout(
        f"{command[:200]!r} ran past its {timeout:g} s timeout{place} and its process group"
        " was killed; raise the timeout or make the command finish sooner",
        command=command,
        timeout_s=timeout,
    )


def listing(directory: str, entries: Iterable[tuple[str, int, bool]]) -> list[FileInfo]:
    """``list_files``' answer for ``directory`` from its entries as ``(name, size, is_dir)``:
    each under its path in the sandbox, sorted by path."""
    infos = [
        FileInfo(path=posixpath.join(directory, name), size=int(size), is_dir=bool(is_dir))
        for name, size, is_dir in entries
    ]
    return sorted(infos, key=lambda info: info.path)


@dataclass(frozen=True, slots=True)
class RemoteGateway:
    """The outbound allow list of a remote sandbox with ``network = "gateway"``: ``cidrs`` (the
    gateway's address as a one-address CIDR) when the URL names an IP address, ``domains``
    (its host name) otherwise. Such lists filter by address, not by port: the sandbox reaches
    every port of that address."""

    cidrs: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()


def remote_gateway(spec: SandboxSpec, service: str) -> RemoteGateway | None:
    """The allow list for ``spec`` on ``service`` (``"modal"``), or ``None`` when the spec's
    network is not ``"gateway"``. A gateway-mode spec without ``gateway_url`` allows nothing
    (empty lists). Raises ``SandboxCreateError`` for a URL the service's sandboxes cannot
    reach: not http(s), or on a loopback, link-local or unspecified address of this machine."""
    if spec.network is not NetworkPolicy.GATEWAY:
        return None
    url = spec.gateway_url
    if url is None:
        return RemoteGateway()
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise SandboxCreateError(
            f"gateway_url {url!r} is not an http(s)://host[:port] URL; a {service} sandbox"
            " reaches the gateway by its address"
        )
    if is_local_only(host):
        raise SandboxCreateError(
            f"{service} sandboxes run on {service}'s machines and cannot reach the gateway at"
            f" {url}, an address of this machine only; serve the gateway on an address they"
            " can reach ([gateway] host, behind its token) or use the local sandbox backend"
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return RemoteGateway(domains=(host,))
    return RemoteGateway(cidrs=(f"{address}/{address.max_prefixlen}",))
