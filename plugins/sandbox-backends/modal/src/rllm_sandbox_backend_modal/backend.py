"""The ``modal`` sandbox backend: rllm-core's sandbox contract over the modal SDK's async API.

Every SDK call goes through the ``client`` given to :class:`ModalBackend`: the ``modal``
module by default, or an object with the same ``App``, ``Sandbox`` and ``Image`` attributes
(tests pass a fake). Methods are called through their ``.aio`` variants.

How the spec maps onto ``modal.Sandbox.create``: ``cpu`` in cores and ``memory_mb`` in MiB
as they are; ``lifetime_s`` becomes ``timeout`` (whole seconds, rounded up); ``network =
"none"`` becomes ``block_network=True``; ``network = "gateway"`` becomes an outbound allow
list holding only the gateway's address (``outbound_cidr_allowlist`` for an IP address,
``outbound_domain_allowlist`` for a host name; every port of that address is reachable), and
a gateway on this machine's loopback is refused, Modal's machines cannot reach it (without a
``gateway_url`` the network is blocked); ``env`` is the sandbox env (and is exported again
in every command, after the login profile); ``labels`` plus the backend's ``rllm-run`` tag
become the sandbox's tags. The image is ``spec.image`` from a registry, else the Dockerfile
text built by Modal, else the configured default. A Dockerfile is built with the spec's
``context_dir`` (the folder its ``COPY`` sources are read from, such as a Harbor task's
``environment/``) as its build context: Modal sends the files its ``COPY`` lines name,
minus those a ``.dockerignore`` there excludes. Without one, the context is an empty folder,
so a ``COPY`` fails the build rather than sending files of the current directory.
``disk_mb`` has no Modal parameter and is ignored.

Commands go through the shell protocol of :mod:`rllm_core.kit.remote_exec` with
``login_bash``: Modal's ``exec`` runs the wrapper as ``sh -c SCRIPT``, the command itself runs
under ``bash -l`` with its output capped in the sandbox, and a timed-out command's process
group is killed by a second ``exec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import posixpath
import re
import secrets
import shlex
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rllm_core.errors import (
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
)
from rllm_core.kit.remote_exec import (
    kill_script,
    parse_report,
    runnable,
    wrap,
)
from rllm_core.kit.retry import Pacer
from rllm_core.kit.sandboxes import (
    ClosesOnExit,
    command_timed_out,
    listing,
    remote_gateway,
    retry_transient,
)
from rllm_core.types import ExecResult, FileInfo, NetworkPolicy, SandboxSpec

from rllm_sandbox_backend_modal.errors import translate
from rllm_sandbox_backend_modal.plugin import ModalConfig

__all__ = ["RUN_TAG", "ModalBackend", "ModalSandbox", "build_context"]

RUN_TAG = "rllm-run"
"""The tag whose value is the backend's ``run_id``; :meth:`ModalBackend.cleanup` finds
a run's sandboxes by it."""

T = TypeVar("T")
_TAG = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
_STATUS_TIMEOUT_S = 10.0
_log = logging.getLogger(__name__)


def _modal_module() -> Any:
    import modal

    return modal


async def _read(stream: AsyncIterator[bytes | str]) -> bytes:
    data = bytearray()
    async for chunk in stream:
        data += chunk.encode() if isinstance(chunk, str) else chunk
    return bytes(data)


class ModalSandbox(ClosesOnExit):
    """One Modal sandbox. See :class:`rllm_core.ports.Sandbox` for the contract."""

    merges_output = False

    def __init__(self, handle: Any, *, spec: SandboxSpec, backend: ModalBackend) -> None:
        self.handle = handle
        self.spec = spec
        self.gateway_url = spec.gateway_url if spec.network is NetworkPolicy.GATEWAY else None
        self.workdir = spec.workdir
        self._backend = backend
        self._config = backend.config
        self._closed = False

    @property
    def sandbox_id(self) -> str:
        return str(getattr(self.handle, "object_id", "?"))

    def __repr__(self) -> str:
        return f"ModalSandbox({self.sandbox_id}, workdir={self.workdir!r})"

    # ---------------------------------------------------------------- helpers

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SandboxGone(
                f"{what}: modal sandbox {self.sandbox_id} is closed; create a new one"
            )

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def _sdk(self, what: str, call: Callable[[], Awaitable[T]], *, retry: bool) -> T:
        """Await an SDK call, translating its errors; retry transient ones when ``retry``."""

        async def once() -> T:
            try:
                return await call()
            except Exception as exc:
                raise translate(exc, f"{what} in modal sandbox {self.sandbox_id}") from exc

        if not retry:
            return await once()
        return await self._backend.retrying(once, what)

    # ---------------------------------------------------------------- exec

    async def exec(
        self,
        command: str,
        timeout: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        self._check_open("exec")
        what = f"exec {command[:200]!r}"
        call_id = uuid.uuid4().hex
        wrapped = wrap(
            command,
            call_id=call_id,
            cwd=self._path(cwd) if cwd else self.workdir,
            env={**self.spec.env, **(env or {})},
            user=user or self.spec.user,
            output_limit_bytes=self._config.output_limit_bytes,
            login_bash=True,
        )
        started = time.monotonic()
        argv = ("sh", "-c", await runnable(wrapped.script, call_id, self.write_file))
        # Modal's own deadline is a backstop one second past ours; when it fires first,
        # wait() returns -1 and the command is handled as timed out all the same.
        process = await self._sdk(
            what,
            lambda: self.handle.exec.aio(*argv, timeout=math.ceil(timeout) + 1, text=False),
            retry=False,
        )
        waiter = asyncio.ensure_future(process.wait.aio())
        out = asyncio.ensure_future(_read(process.stdout))
        err = asyncio.ensure_future(_read(process.stderr))
        tasks = {waiter, out, err}
        try:
            done, pending = await asyncio.wait(tasks, timeout=timeout)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise translate(exc, f"{what} in modal sandbox {self.sandbox_id}") from exc
        if pending or waiter.result() == -1:
            await self._kill(call_id, what)
            raise command_timed_out(command, timeout, f"in modal sandbox {self.sandbox_id}")
        report = parse_report(out.result().decode("utf-8", errors="replace"), wrapped.marker)
        if report is None:
            raise SandboxError(
                f"{what} in modal sandbox {self.sandbox_id} printed no exit report (exit"
                f" {waiter.result()}); the image needs bash, sh, base64, head and setsid."
                f" Error output: {err.result()[-500:].decode(errors='replace')!r}"
            )
        return report.exec_result(time.monotonic() - started)

    async def _kill(self, call_id: str, what: str) -> None:
        """Kill the process group of a timed-out command; a failure here is logged, since the
        timeout is what the caller must hear about."""
        try:
            process = await self.handle.exec.aio(
                "sh",
                "-c",
                kill_script(call_id),
                timeout=math.ceil(self._config.kill_timeout_s),
                text=False,
            )
            await asyncio.wait_for(process.wait.aio(), self._config.kill_timeout_s)
        except Exception as exc:
            _log.warning(
                "could not kill the process group of timed-out %s in modal sandbox %s: %s",
                what,
                self.sandbox_id,
                exc,
            )

    # ---------------------------------------------------------------- files

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open("write_file")
        target = self._path(path)
        payload = bytes(data)
        await self._sdk(
            f"write_file {target}",
            lambda: self.handle.filesystem.write_bytes.aio(payload, target),
            retry=True,
        )

    async def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        target = self._path(path)
        try:
            data = await self._sdk(
                f"read_file {target}",
                lambda: self.handle.filesystem.read_bytes.aio(target),
                retry=True,
            )
        except SandboxError as exc:
            if _is_not_a_directory(exc.__cause__):
                raise SandboxFileNotFound(f"read_file: no file {target} in the sandbox") from exc
            raise
        return bytes(data)

    async def list_files(self, path: str) -> list[FileInfo]:
        self._check_open("list_files")
        target = self._path(path)
        entries = await self._sdk(
            f"list_files {target}",
            lambda: self.handle.filesystem.list_files.aio(target),
            retry=True,
        )
        return listing(target, ((e.name, e.size, e.is_dir()) for e in entries))

    # ---------------------------------------------------------------- lifecycle

    async def is_alive(self) -> bool:
        if self._closed:
            return False
        try:
            code = await asyncio.wait_for(self.handle.poll.aio(), _STATUS_TIMEOUT_S)
        except Exception:
            return False
        return code is None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.forget(self)
        try:
            await self._sdk("terminate", lambda: self.handle.terminate.aio(), retry=True)
        except SandboxGone:
            pass
        except SandboxError as exc:
            _log.warning(
                "could not terminate modal sandbox %s (its lifetime of %g s still bounds it;"
                " ModalBackend.cleanup() finds it by its %s tag): %s",
                self.sandbox_id,
                self.spec.lifetime_s,
                RUN_TAG,
                exc,
            )


def _is_not_a_directory(exc: BaseException | None) -> bool:
    from modal.exception import SandboxFilesystemNotADirectoryError

    return isinstance(exc, SandboxFilesystemNotADirectoryError)


def build_context(spec: SandboxSpec) -> Path | None:
    """The spec's ``context_dir`` as a path, or ``None`` when it names none."""
    return Path(spec.context_dir) if spec.context_dir else None


class ModalBackend:
    """Creates :class:`ModalSandbox` es in the Modal app named by the config.

    ``client`` replaces the ``modal`` module (an object with ``App``, ``Sandbox`` and ``Image``
    shaped like the SDK's); ``clock`` and ``sleep`` pace creations and retries and can be
    replaced in tests. Creation requests are spaced ``create_interval_s`` apart, and
    creation, file and lifecycle calls that fail transiently are retried with exponential
    backoff; commands are never retried, since they may not be idempotent.
    """

    def __init__(
        self,
        config: ModalConfig | None = None,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config or ModalConfig()
        self.modal = client if client is not None else _modal_module()
        self.run_id = self.config.run_id or secrets.token_hex(6)
        self._sleep = sleep
        self._pace = Pacer(self.config.create_interval_s, clock=clock, sleep=sleep)
        self._app: Any = None
        self._sandboxes: list[ModalSandbox] = []

    # ---------------------------------------------------------------- helpers

    async def retrying(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """Await ``call()`` (which raises translated errors), retrying a
        ``SandboxTransientError`` up to ``retries`` times. When they run out, the last one is
        raised with the attempt count and what to do added, its SDK error as ``__cause__``;
        any other error is raised at once."""
        return await retry_transient(call, self.config, what=what, sleep=self._sleep)

    async def app(self) -> Any:
        """The hydrated Modal app, looked up (and created when missing) once."""
        if self._app is None:
            name = self.config.app_name

            async def lookup() -> Any:
                try:
                    return await self.modal.App.lookup.aio(
                        name,
                        create_if_missing=True,
                        environment_name=self.config.environment_name,
                    )
                except Exception as exc:
                    raise translate(exc, f"looking up modal app {name!r}", creating=True) from exc

            self._app = await self.retrying(lookup, f"looking up modal app {name!r}")
        return self._app

    def tags(self, spec: SandboxSpec) -> dict[str, str]:
        """The spec's labels plus this run's tag; raises ``SandboxCreateError`` for a label
        Modal would refuse."""
        tags = {**spec.labels, RUN_TAG: self.run_id}
        for key, value in tags.items():
            for part in (key, value):
                if not _TAG.match(part):
                    raise SandboxCreateError(
                        f"sandbox label {key!r}={value!r} cannot be a modal tag: use 1 to 63"
                        " letters, digits, '.', '_' or '-'"
                    )
        return tags

    def image(self, spec: SandboxSpec, scratch: Path) -> Any:
        """The Modal image for ``spec``; a Dockerfile is written under ``scratch``, which must
        outlive the creation call, and built with the spec's build context (see the module
        docstring). Raises ``SandboxCreateError`` when that context is not a directory."""
        images = self.modal.Image
        if spec.image:
            return images.from_registry(spec.image)
        if spec.dockerfile:
            context = build_context(spec)
            if context is not None and not context.is_dir():
                raise SandboxCreateError(
                    f"the Dockerfile's build context {context} is not a directory; the task"
                    " source must point context_dir at the folder holding the files it copies"
                )
            build = scratch / "build"
            build.mkdir()
            path = scratch / "Dockerfile"
            path.write_text(spec.dockerfile)
            return images.from_dockerfile(path, context_dir=context or build)
        if self.config.default_image:
            return images.from_registry(self.config.default_image)
        return images.debian_slim()

    def create_kwargs(self, spec: SandboxSpec, app: Any, image: Any) -> dict[str, Any]:
        """The keyword arguments of ``modal.Sandbox.create`` for ``spec``."""
        kwargs: dict[str, Any] = {
            "app": app,
            "image": image,
            "tags": self.tags(spec),
            "env": dict(spec.env),
            "timeout": max(1, math.ceil(spec.lifetime_s)),
            "workdir": spec.workdir,
            "cpu": float(spec.cpu),
            "memory": int(spec.memory_mb),
            "block_network": spec.network == NetworkPolicy.NONE,
        }
        allowed = remote_gateway(spec, "modal")
        if allowed is not None and not (allowed.cidrs or allowed.domains):
            kwargs["block_network"] = True
        elif allowed is not None:
            kwargs["outbound_cidr_allowlist"] = list(allowed.cidrs)
            if allowed.domains:
                kwargs["outbound_domain_allowlist"] = list(allowed.domains)
        if self.config.idle_timeout_s is not None:
            kwargs["idle_timeout"] = self.config.idle_timeout_s
        if self.config.region is not None:
            kwargs["region"] = self.config.region
        return kwargs

    # ---------------------------------------------------------------- contract

    async def create(self, spec: SandboxSpec) -> ModalSandbox:
        if not posixpath.isabs(spec.workdir):
            raise SandboxCreateError(
                f"workdir {spec.workdir!r} is relative; a modal sandbox needs an absolute one"
            )
        if spec.cpu <= 0 or spec.memory_mb <= 0:
            raise SandboxCreateError(
                f"cpu={spec.cpu} and memory_mb={spec.memory_mb} must both be positive"
            )
        app = await self.app()
        with tempfile.TemporaryDirectory(prefix="rllm-modal-") as scratch:
            kwargs = self.create_kwargs(spec, app, self.image(spec, Path(scratch)))

            async def create_once() -> Any:
                await self._pace.wait()
                try:
                    return await self.modal.Sandbox.create.aio(**kwargs)
                except Exception as exc:
                    raise translate(exc, "creating a modal sandbox", creating=True) from exc

            handle = await self.retrying(create_once, "creating a modal sandbox")
        sandbox = ModalSandbox(handle, spec=spec, backend=self)
        self._sandboxes.append(sandbox)
        try:
            await self._prepare(sandbox)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _prepare(self, sandbox: ModalSandbox) -> None:
        """Create the workdir and, for a spec user, check the user exists and owns it."""
        spec = sandbox.spec
        workdir = spec.workdir
        try:
            await sandbox._sdk(
                f"creating workdir {workdir}",
                lambda: sandbox.handle.filesystem.make_directory.aio(workdir),
                retry=True,
            )
        except SandboxError as exc:
            raise SandboxCreateError(f"cannot create workdir {workdir}: {exc}") from exc
        if spec.user:
            check = (
                'id -u "$1" >/dev/null 2>&1 || { echo "no user $1 in the image" >&2; exit 3; };'
                ' chown "$1" "$2"'
            )
            args = " ".join(shlex.quote(arg) for arg in (check, "rllm-user", spec.user, workdir))
            result = await sandbox.exec(
                f"bash -c {args}",
                timeout=60,
                user="root",
            )
            if result.exit_code != 0:
                raise SandboxCreateError(
                    f"cannot run as user {spec.user!r}: {result.stderr.strip() or result.stdout}"
                    f" (exit {result.exit_code}); create the user in the image or leave user"
                    " unset"
                )

    def forget(self, sandbox: ModalSandbox) -> None:
        if sandbox in self._sandboxes:
            self._sandboxes.remove(sandbox)

    async def close(self) -> None:
        sandboxes = list(self._sandboxes)
        await asyncio.gather(*(sb.close() for sb in sandboxes), return_exceptions=True)

    # ---------------------------------------------------------------- leaks

    async def cleanup(self, labels: Mapping[str, str] | None = None) -> int:
        """Terminate every running sandbox of the app whose tags include ``labels``.

        ``labels`` defaults to this backend's ``{"rllm-run": run_id}``, which removes what a
        run left behind; pass ``{"rllm-run": "<id>"}`` to clean up another run. Returns how
        many sandboxes were terminated.
        """
        wanted = dict(labels) if labels else {RUN_TAG: self.run_id}
        app = await self.app()
        what = f"listing modal sandboxes tagged {wanted}"
        try:
            found = [sb async for sb in self.modal.Sandbox.list.aio(app_id=app.app_id, tags=wanted)]
        except Exception as exc:
            raise translate(exc, what) from exc
        for handle in found:
            with contextlib.suppress(SandboxGone):
                await self.retrying(lambda h=handle: _terminate(h), "terminating a leaked sandbox")
        return len(found)


async def _terminate(handle: Any) -> None:
    try:
        await handle.terminate.aio()
    except Exception as exc:
        raise translate(exc, f"terminating modal sandbox {handle.object_id}") from exc
