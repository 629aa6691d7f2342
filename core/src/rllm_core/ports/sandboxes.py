"""Contracts for sandbox backends and the sandboxes they create."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Protocol, runtime_checkable

import msgspec

from rllm_core.types import ExecResult, FileInfo, SandboxSpec, Task

__all__ = ["BuildsDockerfiles", "EndsProcesses", "Sandbox", "SandboxBackend", "task_for_backend"]


@runtime_checkable
class Sandbox(Protocol):
    """An isolated environment an agent acts in.

    Contract (every backend, checked by the sandbox conformance suite):

    - ``exec`` runs ``command`` through a shell in ``cwd`` (default: the spec's workdir) as
      ``user`` with ``env`` added to the sandbox env. It returns an
      :class:`~rllm_core.types.ExecResult`; a process killed by signal ``n`` reports ``128+n``.
      Output above the backend's limit is cut with ``truncated=True``; large outputs never
      deadlock. Undecodable bytes are replaced, not raised.
    - Past ``timeout`` seconds it raises ``SandboxCommandTimeout`` and the command's whole
      process tree is gone.
    - ``merges_output`` is true when the backend cannot separate stderr from stdout.
    - File paths are absolute, or relative to the workdir, which the backend creates.
      ``write_file`` creates missing parent directories; ``write_file`` / ``read_file``
      round-trip bytes exactly, any size; reading a missing path raises
      ``SandboxFileNotFound``. ``list_files`` lists one directory, not recursively; each
      ``FileInfo.path`` is the entry's absolute path.
    - ``is_alive()`` is cheap and never raises. ``close()`` is idempotent. After close, calls
      raise ``SandboxGone``.
    - Failures raise subclasses of ``SandboxError`` with the backend's exception as
      ``__cause__``; ``SandboxTransientError`` marks the retryable ones.
    - The network is the spec's ``network`` (:class:`~rllm_core.types.NetworkPolicy`). With
      ``"gateway"`` and a ``gateway_url``, ``gateway_url`` is that URL as the sandbox's
      processes reach it (the same URL, or one the backend relays to it); they reach nothing
      else, neither other ports of the gateway's host nor other hosts, unless the backend's
      README says what more it lets through. With any other network, or without the spec's
      ``gateway_url``, it is ``None``.

    Example::

        async with await backend.create(SandboxSpec(workdir="/work")) as sb:
            result = await sb.exec("echo hi", timeout=10)
    """

    merges_output: bool
    gateway_url: str | None

    async def exec(
        self,
        command: str,
        timeout: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def list_files(self, path: str) -> list[FileInfo]: ...

    async def is_alive(self) -> bool: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Creates sandboxes from a :class:`~rllm_core.types.SandboxSpec`.

    ``create`` raises ``SandboxCreateError`` when the spec cannot be satisfied (a network the
    backend cannot enforce included: its message names the backend and what to change) and
    ``SandboxAuthError`` when credentials are missing. ``close`` releases every sandbox the
    backend still holds and is idempotent.
    """

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def close(self) -> None: ...


@runtime_checkable
class BuildsDockerfiles(Protocol):
    """A sandbox backend that builds a spec's ``dockerfile`` itself, with ``context_dir`` as
    the build context, when the spec names no ``image``; its ``builds_dockerfiles`` is True.

    A task source may describe a Dockerfile environment twice over: ``image`` its ``FROM``
    line and ``replays_dockerfile`` on, so that any backend boots the base image and the
    source's ``prepare`` replays the ``RUN``/``COPY`` steps; and ``dockerfile`` with
    ``context_dir``, the real build. The rollout (and ``rllm-core tasks check``) hands a
    backend that builds Dockerfiles the second (:func:`task_for_backend`): the task's
    environment with ``image`` unset and ``replays_dockerfile`` off, to ``create``,
    ``prepare``, the harness and ``grade`` alike, so the source replays nothing. Every other
    backend gets the task as the source wrote it.
    """

    builds_dockerfiles: bool


def task_for_backend(task: Task, backend: object) -> Task:
    """``task`` as ``backend`` should run it: when the backend builds Dockerfiles
    (:class:`BuildsDockerfiles`) and the task's environment replays its ``dockerfile`` on the
    base image, the environment without that image and with replay off, so that the backend
    builds the Dockerfile; otherwise ``task`` itself."""
    spec = task.environment
    if (
        spec is None
        or not spec.replays_dockerfile
        or spec.dockerfile is None
        or getattr(backend, "builds_dockerfiles", False) is not True
    ):
        return task
    built = msgspec.structs.replace(spec, image=None, replays_dockerfile=False)
    return msgspec.structs.replace(task, environment=built)


@runtime_checkable
class EndsProcesses(Protocol):
    """A sandbox that can end what an agent left running, so that its verifier runs alone.

    The rollout calls ``mark_processes`` after the task source's ``prepare`` and
    ``end_processes`` after the harness returns, before ``grade``. Without it, a process the
    agent started in the background (a loop rewriting the reward file, one waiting for the
    test script to appear) would still run while the verifier does.

    - ``mark_processes()``: every process running in the sandbox now belongs to its
      environment (a service the setup started) and is spared by ``end_processes``.
    - ``end_processes()`` kills, with ``SIGKILL``, every other process of the sandbox: also
      those that left their session or process group, were reparented, or run as another
      user. It returns how many it killed once none runs any more, and raises
      ``SandboxError`` when one survives. The sandbox stays open and usable. A backend whose
      sandboxes have no process table of their own (plain host processes) may find only some
      of them; its README says which.
    """

    async def mark_processes(self) -> None: ...

    async def end_processes(self) -> int: ...
