"""The ``daytona`` sandbox backend: rllm-core's sandbox contract over the daytona SDK.

:class:`DaytonaBackend` creates Daytona sandboxes from a :class:`~rllm_core.types.SandboxSpec`;
:class:`DaytonaSandbox` runs commands and moves files in one. Commands go through the shell
protocol of :mod:`rllm_core.kit.remote_exec`; SDK exceptions are translated by
:mod:`rllm_sandbox_backend_daytona.errors`.

Pass ``client=`` to use an already built ``AsyncDaytona`` (or a stand-in with the same
methods); otherwise one is built on first use, per event loop, from the config or the
``DAYTONA_*`` environment variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import posixpath
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from daytona import (
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaError,
    DaytonaTimeoutError,
    Image,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
)
from rllm_core.errors import (
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxGone,
    SandboxTransientError,
)
from rllm_core.kit.remote_exec import (
    kill_script,
    launcher,
    parse_report,
    runnable,
    validate_user,
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

from rllm_sandbox_backend_daytona.errors import Context, retry_after_s, translate
from rllm_sandbox_backend_daytona.plugin import DaytonaSandboxConfig

__all__ = ["MANAGED_LABEL", "RUN_LABEL", "DaytonaBackend", "DaytonaSandbox", "cleanup"]

log = logging.getLogger(__name__)

T = TypeVar("T")

RUN_LABEL = "rllm-run"
MANAGED_LABEL = "rllm-managed"

# Extra seconds the daemon's own timeout allows beyond ours, so that ours always fires first.
_DAEMON_GRACE_S = 30
_KILL_TIMEOUT_S = 30.0


def _gib(mib: int) -> int:
    """MiB rounded up to whole GiB (Daytona sizes resources in GiB), at least 1."""
    return max(1, math.ceil(mib / 1024))


class DaytonaSandbox(ClosesOnExit):
    """One Daytona sandbox. Output is merged: stderr arrives inside ``stdout``.

    ``is_alive()`` answers from what this object knows (closed, or a call found the sandbox
    gone) without a network call.
    """

    merges_output = True

    def __init__(self, *, backend: DaytonaBackend, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self._backend = backend
        self._sdk = sdk_sandbox
        self.spec = spec
        self.gateway_url = spec.gateway_url if spec.network is NetworkPolicy.GATEWAY else None
        self.workdir = spec.workdir
        self.id: str = str(getattr(sdk_sandbox, "id", ""))
        self._closed = False
        self._gone = False

    # ---------------------------------------------------------------- helpers

    def _check_open(self, what: str) -> None:
        if self._closed or self._gone:
            state = "closed" if self._closed else "gone"
            raise SandboxGone(f"{what}: Daytona sandbox {self.id} is {state}; create a new one")

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _failed(self, exc: BaseException, *, context: Context, what: str) -> SandboxError:
        error = translate(exc, context=context, what=what)
        if isinstance(error, SandboxGone):
            self._gone = True
        return error

    async def _call(
        self, what: str, context: Context, call: Callable[[], Awaitable[T]], *, retry: bool
    ) -> T:
        try:
            if retry:
                return await self._backend.retrying(what, context, call)
            return await call()
        except Exception as exc:
            error = self._failed(exc, context=context, what=what)
            if error is exc:
                raise
            raise error from exc

    # ---------------------------------------------------------------- exec

    async def exec(
        self,
        command: str,
        timeout: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (see :class:`rllm_core.ports.Sandbox`).

        A timeout above ``session_threshold_s`` runs the command as an asynchronous session
        command, polled every ``poll_interval_s``; a shorter one is one ``process.exec`` call.
        Either way, past ``timeout`` the command's process group is killed and
        ``SandboxCommandTimeout`` raised.
        """
        return await self._exec(
            command, timeout, user if user is not None else self.spec.user, env, cwd
        )

    async def _exec(
        self,
        command: str,
        timeout: float,
        user: str | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> ExecResult:
        """``exec`` with ``user=None`` meaning the sandbox's own OS user (no switch)."""
        self._check_open("exec")
        if not timeout > 0:
            raise SandboxError(f"exec timeout must be positive, got {timeout!r}")
        config = self._backend.config
        call_id = uuid.uuid4().hex
        wrapped = wrap(
            command,
            call_id=call_id,
            cwd=self._path(cwd) if cwd else self.workdir,
            env={**self.spec.env, **(env or {})},
            user=user,
            output_limit_bytes=config.output_limit_bytes,
            merge_output=True,
        )
        started = time.monotonic()
        remote = await runnable(wrapped.script, call_id, self.write_file, inline=launcher)
        if timeout > config.session_threshold_s:
            text = await self._run_in_session(remote, call_id, command, timeout, started)
        else:
            text = await self._run_direct(remote, call_id, command, timeout)
        report = parse_report(text, wrapped.marker)
        if report is None:
            raise SandboxError(
                f"{command[:200]!r} in Daytona sandbox {self.id} printed no exit report;"
                f" the image needs sh, base64, head and setsid. Output: {text[-500:]!r}"
            )
        return report.exec_result(time.monotonic() - started)

    async def _run_direct(self, remote: str, call_id: str, command: str, timeout: float) -> str:
        daemon_timeout = math.ceil(timeout) + _DAEMON_GRACE_S
        task = asyncio.ensure_future(self._sdk.process.exec(remote, timeout=daemon_timeout))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await self._kill(call_id)
            raise self._timed_out(command, timeout)
        try:
            response = task.result()
        except Exception as exc:
            error = self._failed(exc, context="exec", what=f"exec {command[:100]!r}")
            if isinstance(error, SandboxCommandTimeout):
                await self._kill(call_id)
            raise error from exc
        return str(response.result or "")

    async def _run_in_session(
        self, remote: str, call_id: str, command: str, timeout: float, started: float
    ) -> str:
        process = self._sdk.process
        session_id = f"rllm-{call_id}"
        what = f"session command {command[:100]!r}"
        await self._call(
            "create session", "exec", lambda: process.create_session(session_id), retry=True
        )
        try:
            response = await self._call(
                what,
                "exec",
                lambda: process.execute_session_command(
                    session_id, SessionExecuteRequest(command=remote, run_async=True)
                ),
                retry=False,
            )
            cmd_id = response.cmd_id
            interval = self._backend.config.poll_interval_s
            while True:
                remaining = started + timeout - time.monotonic()
                if remaining <= 0:
                    await self._kill(call_id)
                    raise self._timed_out(command, timeout)
                await asyncio.sleep(min(interval, remaining))
                status = await self._call(
                    f"poll {what}",
                    "exec",
                    lambda: process.get_session_command(session_id, cmd_id),
                    retry=True,
                )
                if status.exit_code is not None:
                    break
            logs = await self._call(
                f"logs of {what}",
                "exec",
                lambda: process.get_session_command_logs(session_id, cmd_id),
                retry=True,
            )
        finally:
            if not (self._closed or self._gone):
                try:
                    await process.delete_session(session_id)
                except Exception as exc:
                    log.debug("deleting session %s of sandbox %s: %s", session_id, self.id, exc)
        if logs.output is not None:
            return str(logs.output)
        return str(logs.stdout or "") + str(logs.stderr or "")

    def _timed_out(self, command: str, timeout: float) -> SandboxCommandTimeout:
        return command_timed_out(command, timeout, f"in Daytona sandbox {self.id}")

    async def _kill(self, call_id: str) -> None:
        """Kill the process group of a timed-out call; failures are logged, not raised."""
        try:
            await asyncio.wait_for(
                self._sdk.process.exec(
                    launcher(kill_script(call_id)), timeout=math.ceil(_KILL_TIMEOUT_S)
                ),
                _KILL_TIMEOUT_S,
            )
        except Exception as exc:
            log.warning("could not kill timed-out call %s in sandbox %s: %s", call_id, self.id, exc)

    # ---------------------------------------------------------------- files

    async def write_file(self, path: str, data: bytes) -> None:
        """Upload ``data``; when the upload fails, create the parent directory and retry once."""
        self._check_open("write_file")
        target = self._path(path)
        payload = bytes(data)
        fs = self._sdk.fs
        what = f"write_file({target!r})"
        try:
            await self._call(what, "file", lambda: fs.upload_file(payload, target), retry=True)
            return
        except SandboxError as exc:
            if isinstance(exc, (SandboxGone, SandboxTransientError)) or self._gone:
                raise
            first_error = exc
        parent = posixpath.dirname(target)
        made = await self._exec(f"mkdir -p -- {shlex.quote(parent)}", 60, None, None, "/")
        if made.exit_code != 0:
            raise SandboxError(
                f"{what}: cannot create the parent directory {parent}: {made.stdout.strip()}"
            ) from first_error
        await self._call(what, "file", lambda: fs.upload_file(payload, target), retry=True)

    async def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        target = self._path(path)
        fs = self._sdk.fs
        data = await self._call(
            f"read_file({target!r})", "file", lambda: fs.download_file(target), retry=True
        )
        return bytes(data)

    async def list_files(self, path: str) -> list[FileInfo]:
        self._check_open("list_files")
        target = self._path(path)
        fs = self._sdk.fs
        entries = await self._call(
            f"list_files({target!r})", "file", lambda: fs.list_files(target), retry=True
        )
        return listing(target, ((e.name, e.size, e.is_dir) for e in entries))

    # ---------------------------------------------------------------- lifecycle

    async def is_alive(self) -> bool:
        return not (self._closed or self._gone)

    async def close(self) -> None:
        """Delete the sandbox. Idempotent; a failed delete is logged (the sandbox's lifetime
        and :meth:`DaytonaBackend.cleanup` reclaim it)."""
        if self._closed:
            return
        self._closed = True
        self._backend.forget(self)
        if self._gone:
            return
        try:
            await self._backend.retrying(
                f"delete sandbox {self.id}", "other", lambda: self._sdk.delete()
            )
        except Exception as exc:
            if not isinstance(translate(exc, context="other", what="delete"), SandboxGone):
                log.warning(
                    "could not delete Daytona sandbox %s (its lifetime or cleanup() will): %s",
                    self.id,
                    exc,
                )


class DaytonaBackend:
    """Creates :class:`DaytonaSandbox` es.

    Every sandbox carries the labels ``rllm-managed=true`` and ``rllm-run=<run_label>`` plus
    the config's and the spec's labels, so :meth:`cleanup` can find a run's leftovers.
    Creation is limited to ``max_concurrent_creates`` in flight, started at least
    ``create_interval_s`` apart, and retried with jittered exponential backoff on transient
    errors. ``clock`` and ``sleep`` drive the pacing and the retry waits; tests replace them.
    With ``build_dockerfiles`` on the backend builds Dockerfiles
    (:class:`~rllm_core.ports.BuildsDockerfiles`): the rollout hands it a task's Dockerfile
    and build context rather than the FROM image the task source would replay it on.
    """

    def __init__(
        self,
        config: DaytonaSandboxConfig | None = None,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config or DaytonaSandboxConfig()
        self._sleep = sleep
        self._pacer = Pacer(self.config.create_interval_s, clock=clock, sleep=sleep)
        self.run_label = self.config.run_label or uuid.uuid4().hex[:12]
        self._injected = client
        self._sdk_client: Any = None
        self._sdk_loop: asyncio.AbstractEventLoop | None = None
        self._sandboxes: list[DaytonaSandbox] = []
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    @property
    def builds_dockerfiles(self) -> bool:
        return self.config.build_dockerfiles

    # ---------------------------------------------------------------- SDK plumbing

    async def client(self) -> Any:
        """The SDK client: the injected one, or an ``AsyncDaytona`` for the running loop."""
        if self._injected is not None:
            return self._injected
        loop = asyncio.get_running_loop()
        if self._sdk_client is None or self._sdk_loop is not loop:
            from daytona import AsyncDaytona, DaytonaConfig

            settings = DaytonaConfig(
                api_key=self.config.api_key, api_url=self.config.api_url, target=self.config.target
            )
            try:
                self._sdk_client = AsyncDaytona(settings)
            except Exception as exc:
                raise translate(exc, context="create", what="connecting to Daytona") from exc
            self._sdk_loop = loop
        return self._sdk_client

    async def retrying(self, what: str, context: Context, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()``, retrying up to ``retries`` times on transient errors with
        jittered exponential backoff (a rate limit's ``Retry-After``, capped at
        ``retry_backoff_max_s``, replaces the drawn wait). Raises the translated error from the
        SDK's exception; when the retries run out, with the attempt count and what to do."""

        async def once() -> T:
            try:
                return await call()
            except Exception as exc:
                error = translate(exc, context=context, what=what)
                if error is exc:
                    raise
                raise error from exc

        return await retry_transient(
            once, self.config, what=what, hint=self._retry_after, sleep=self._sleep
        )

    def _retry_after(self, error: BaseException) -> float | None:
        asked = retry_after_s(error.__cause__) if error.__cause__ is not None else None
        return None if asked is None else min(asked, self.config.retry_backoff_max_s)

    def _create_slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.config.max_concurrent_creates))
        return self._slots[1]

    # ---------------------------------------------------------------- creation

    def labels_for(self, spec: SandboxSpec) -> dict[str, str]:
        return {
            MANAGED_LABEL: "true",
            RUN_LABEL: self.run_label,
            **self.config.labels,
            **spec.labels,
        }

    def create_params(
        self, spec: SandboxSpec, scratch: Path | None = None
    ) -> CreateSandboxFromImageParams | CreateSandboxFromSnapshotParams:
        """The SDK's creation parameters for ``spec``.

        - ``image`` set: built from the image with ``Resources`` in whole units (cpu cores
          and memory/disk GiB, each rounded up); an image listed in ``snapshots`` starts from
          that snapshot instead (Daytona ignores resources for snapshots).
        - ``dockerfile`` without an image: Daytona builds it (``Image.from_dockerfile``, with
          the same ``Resources``), its ``COPY`` sources uploaded from the build context
          ``context_dir`` (see :meth:`dockerfile_image`; ``scratch`` is a folder that outlives
          the creation call, needed unless ``context_dir`` holds that very Dockerfile).
        - neither: the ``snapshot`` config (or Daytona's default snapshot).
        - ``lifetime_s`` becomes ``ttl_minutes`` (rounded up), ``auto_stop_minutes`` the idle
          stop, and a stopped sandbox is deleted at once (``auto_delete_interval=0``).
        - ``network="none"`` blocks all network (``network_block_all``); ``network="gateway"``
          allows only the gateway's IP address (``network_allow_list``; every port of that
          address is reachable) and refuses a gateway named by a host name or on this
          machine's loopback, which Daytona's machines cannot reach; without a
          ``gateway_url`` it blocks all network.
        - ``env`` is set on the sandbox and also exported in every command.
        """
        if spec.user is not None:
            try:
                validate_user(spec.user)
            except ValueError as exc:
                raise SandboxCreateError(str(exc)) from exc
        common: dict[str, Any] = {
            "labels": self.labels_for(spec),
            "env_vars": dict(spec.env),
            "auto_stop_interval": self.config.auto_stop_minutes,
            "auto_delete_interval": 0,
            "ttl_minutes": max(1, math.ceil(spec.lifetime_s / 60)),
            "network_block_all": spec.network == NetworkPolicy.NONE,
        }
        allowed = remote_gateway(spec, "daytona")
        if allowed is not None and allowed.domains:
            raise SandboxCreateError(
                f"gateway_url {spec.gateway_url!r} names its host by name; the daytona backend"
                " allows the gateway by IP address only (network_allow_list holds CIDRs):"
                " serve the gateway on an IP address ([gateway] host) and reach it by that"
                " address"
            )
        if allowed is not None and allowed.cidrs:
            common["network_allow_list"] = ",".join(allowed.cidrs)
        elif allowed is not None:
            common["network_block_all"] = True
        if spec.image and spec.image in self.config.snapshots:
            return CreateSandboxFromSnapshotParams(
                snapshot=self.config.snapshots[spec.image], **common
            )
        if spec.image or spec.dockerfile:
            resources = Resources(
                cpu=max(1, math.ceil(spec.cpu)),
                memory=_gib(spec.memory_mb),
                disk=_gib(spec.disk_mb),
            )
            image = spec.image or self.dockerfile_image(spec, scratch)
            return CreateSandboxFromImageParams(image=image, resources=resources, **common)
        return CreateSandboxFromSnapshotParams(snapshot=self.config.snapshot, **common)

    def dockerfile_image(self, spec: SandboxSpec, scratch: Path | None) -> Image:
        """``spec.dockerfile`` as a Daytona ``Image`` whose build context is ``context_dir``
        (unset: an empty one). The SDK reads the context from the Dockerfile's folder, so the
        context's own ``Dockerfile`` is used when it holds the same text; otherwise the
        context is copied under ``scratch`` with the Dockerfile beside it. ``COPY`` sources
        outside the context are refused (``strict_context``), as Docker refuses them. Raises
        ``SandboxCreateError`` naming the context when it is not a folder or the SDK refuses
        the Dockerfile."""
        assert spec.dockerfile is not None
        context = Path(spec.context_dir) if spec.context_dir else None
        if context is not None and not context.is_dir():
            raise SandboxCreateError(
                f"the Dockerfile's build context {context} is not a directory; the task source"
                " must point context_dir at the folder holding the files it copies"
            )
        own = context / "Dockerfile" if context is not None else None
        if own is not None and own.is_file() and own.read_text() == spec.dockerfile:
            path = own
        else:
            if scratch is None:
                raise ValueError(
                    "create_params needs a scratch folder to build a Dockerfile that is not"
                    " its context's own Dockerfile"
                )
            build = scratch / "build"
            if context is not None:
                shutil.copytree(context, build, symlinks=True)
            else:
                build.mkdir()
            path = build / "Dockerfile"
            path.write_text(spec.dockerfile)
        try:
            return Image.from_dockerfile(path, strict_context=True)
        except DaytonaError as exc:
            raise SandboxCreateError(
                f"Daytona cannot build the Dockerfile with the build context"
                f" {context or '(empty)'}: {exc}; copy only files inside the context"
            ) from exc

    async def create(self, spec: SandboxSpec) -> DaytonaSandbox:
        """Create a sandbox for ``spec`` and its workdir (owned by ``spec.user`` when set);
        a Dockerfile's build context is uploaded while the sandbox is created."""
        with tempfile.TemporaryDirectory(prefix="rllm-daytona-") as scratch:
            params = self.create_params(spec, Path(scratch))
            client = await self.client()
            async with self._create_slots():
                await self._pacer.wait()
                try:
                    created = await self.retrying(
                        "create Daytona sandbox",
                        "create",
                        lambda: client.create(
                            params.model_copy(deep=True), timeout=self.config.create_timeout_s
                        ),
                    )
                except SandboxError as error:
                    await self._delete_half_created(error.__cause__, client)
                    raise
        sandbox = DaytonaSandbox(backend=self, sdk_sandbox=created, spec=spec)
        self._sandboxes.append(sandbox)
        await self._make_workdir(sandbox, spec)
        return sandbox

    async def _delete_half_created(self, cause: BaseException | None, client: Any) -> None:
        sandbox_id = getattr(cause, "sandbox_id", None)
        if not isinstance(cause, DaytonaTimeoutError) or not sandbox_id:
            return
        try:
            stale = await client.get(sandbox_id)
            await stale.delete()
        except Exception as exc:
            log.warning("could not delete sandbox %s that did not start: %s", sandbox_id, exc)

    async def _make_workdir(self, sandbox: DaytonaSandbox, spec: SandboxSpec) -> None:
        workdir = shlex.quote(spec.workdir)
        script = f"mkdir -p -- {workdir}"
        if spec.user is not None:
            user = shlex.quote(spec.user)
            script += (
                f' && {{ [ "$(id -un)" = {user} ] || chown {user} {workdir}'
                f" || sudo -n chown {user} {workdir}; }}"
            )
        try:
            result = await sandbox._exec(script, 60, None, None, "/")
        except SandboxError as exc:
            await sandbox.close()
            raise SandboxCreateError(
                f"Daytona sandbox {sandbox.id} started but its workdir {spec.workdir} could not"
                f" be prepared: {exc}"
            ) from exc
        if result.exit_code != 0:
            await sandbox.close()
            raise SandboxCreateError(
                f"cannot create workdir {spec.workdir}"
                + (f" owned by {spec.user!r}" if spec.user else "")
                + f" in Daytona sandbox {sandbox.id}: {result.stdout.strip()[-300:]}"
            )

    # ---------------------------------------------------------------- cleanup and close

    def forget(self, sandbox: DaytonaSandbox) -> None:
        if sandbox in self._sandboxes:
            self._sandboxes.remove(sandbox)

    async def cleanup(self, labels: Mapping[str, str] | None = None) -> list[str]:
        """Delete every sandbox carrying all of ``labels`` (default: this backend's run
        label) and return their ids: the sandboxes a crashed run left behind."""
        wanted = dict(labels) if labels else {RUN_LABEL: self.run_label}
        client = await self.client()
        found = []
        try:
            async for sdk_sandbox in client.list(ListSandboxesQuery(labels=wanted)):
                found.append(sdk_sandbox)
        except Exception as exc:
            raise translate(exc, context="other", what=f"list sandboxes {wanted}") from exc
        deleted = []
        for sdk_sandbox in found:
            sandbox_id = str(sdk_sandbox.id)
            with contextlib.suppress(SandboxGone):
                await self.retrying(
                    f"delete sandbox {sandbox_id}", "other", lambda s=sdk_sandbox: s.delete()
                )
            deleted.append(sandbox_id)
        return deleted

    async def close(self) -> None:
        """Delete every sandbox still open, then release the SDK client this backend built."""
        sandboxes = list(self._sandboxes)
        await asyncio.gather(*(sandbox.close() for sandbox in sandboxes))
        client, self._sdk_client = self._sdk_client, None
        if client is not None and self._sdk_loop is asyncio.get_running_loop():
            try:
                await client.close()
            except Exception as exc:
                log.debug("closing the Daytona client: %s", exc)
        self._sdk_loop = None


async def cleanup(
    labels: Mapping[str, str],
    *,
    config: DaytonaSandboxConfig | None = None,
    client: Any = None,
) -> list[str]:
    """Delete every Daytona sandbox carrying all of ``labels`` and return their ids.

    Example: ``await cleanup({"rllm-run": "3f2a9c1b7d10"})`` removes what that run leaked.
    """
    if not labels:
        raise ValueError("cleanup needs at least one label; refusing to delete every sandbox")
    backend = DaytonaBackend(config, client=client)
    try:
        return await backend.cleanup(labels)
    finally:
        await backend.close()
