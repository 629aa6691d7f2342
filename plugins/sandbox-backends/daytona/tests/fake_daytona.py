"""A stand-in for ``daytona.AsyncDaytona`` that runs everything on this machine.

It has the SDK's method names and async signatures, answers with the SDK's own response
models (``ExecuteResponse``, ``SessionExecuteResponse``, ``Command``,
``SessionCommandLogsResponse``, the toolbox ``FileInfo``) and raises the SDK's exception
classes the way the SDK builds them. Like the Daytona daemon, ``process.exec`` runs the command
string through ``/bin/sh -c`` with stderr merged into stdout, and a command keeps running (and
its output keeps being read) when the caller stops waiting. Each sandbox has a private home
directory (relative paths and the default ``cwd``); absolute paths are this machine's.
Deleting a sandbox kills every process it started, found by a marker variable in their
environment.

:func:`fast_config` is a backend config with tiny delays for driving the fake.

``client.faults[method]`` is a queue of exceptions: the next calls of that method (by name,
such as ``"create"``, ``"exec"``, ``"download_file"``, ``"get_session_command"``) raise them
in order before doing anything. ``client.calls`` records ``(method, detail)`` of every call.
``client.builds`` records, for each creation from a declarative ``Image`` (a Dockerfile), the
Dockerfile and the build-context files read while ``create`` runs, as the SDK uploads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from daytona import (
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    ExecuteResponse,
    Image,
    ListSandboxesQuery,
    SessionExecuteRequest,
    SessionExecuteResponse,
)
from daytona.common.errors import SOURCE_DAEMON, DaytonaNotFoundError, create_daytona_error
from daytona.common.process import ExecutionArtifacts, SessionCommandLogsResponse
from daytona_toolbox_api_client_async import Command
from daytona_toolbox_api_client_async import FileInfo as ToolboxFileInfo
from rllm_sandbox_backend_daytona.plugin import DaytonaSandboxConfig

MARKER_VARIABLE = "FAKE_DAYTONA_SANDBOX"


def fast_config(**overrides: Any) -> DaytonaSandboxConfig:
    """A config with tiny delays, for tests."""
    values: dict[str, Any] = {
        "run_label": "testrun",
        "poll_interval_s": 0.05,
        "retry_backoff_s": 0.001,
        "retry_backoff_max_s": 0.01,
        "create_interval_s": 0.001,
    }
    values.update(overrides)
    return DaytonaSandboxConfig(**values)


def _daemon_error(message: str, status: int, code: str | None = None) -> Exception:
    return create_daytona_error(
        message, status_code=status, code=code, source=SOURCE_DAEMON if code else None
    )


def _processes_of(sandbox_id: str) -> list[int]:
    needle = f"{MARKER_VARIABLE}={sandbox_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                variables = f.read().split(b"\0")
        except OSError:
            continue
        if needle in variables:
            found.append(int(entry))
    return found


class _Running:
    """One command the fake daemon runs: its process and the task reading its output."""

    def __init__(self, command: str, task: asyncio.Task[tuple[int, bytes]]) -> None:
        self.command = command
        self.task = task


class FakeProcess:
    """``sandbox.process``: one-shot commands and session commands."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox
        self.sessions: dict[str, dict[str, _Running]] = {}
        self._ids = itertools.count(1)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: int | None = None,
    ) -> ExecuteResponse:
        self._sandbox.enter("exec", command)
        running = self._sandbox.start(command, cwd=cwd, env=env)
        code, output = await asyncio.shield(running.task)
        text = output.decode("utf-8", errors="replace")
        return ExecuteResponse.model_construct(
            exit_code=code,
            result=text,
            artifacts=ExecutionArtifacts(stdout=text, charts=[]),
            additional_properties={},
        )

    async def create_session(self, session_id: str, request_timeout: float | None = None) -> None:
        self._sandbox.enter("create_session", session_id)
        if session_id in self.sessions:
            raise _daemon_error(f"session {session_id} already exists", 409)
        self.sessions[session_id] = {}

    def _session(self, session_id: str) -> dict[str, _Running]:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise _daemon_error(
                f"session {session_id} not found", 404, "PROCESS_NOT_FOUND"
            ) from None

    async def execute_session_command(
        self, session_id: str, req: SessionExecuteRequest, timeout: int | None = None
    ) -> SessionExecuteResponse:
        self._sandbox.enter("execute_session_command", req.command)
        commands = self._session(session_id)
        cmd_id = f"cmd-{next(self._ids)}"
        running = self._sandbox.start(req.command, cwd=None, env=None)
        commands[cmd_id] = running
        if req.run_async:
            return SessionExecuteResponse.model_construct(
                cmd_id=cmd_id, output=None, stdout="", stderr="", exit_code=None
            )
        code, output = await asyncio.shield(running.task)
        text = output.decode("utf-8", errors="replace")
        return SessionExecuteResponse.model_construct(
            cmd_id=cmd_id, output=text, stdout=text, stderr="", exit_code=code
        )

    def _command(self, session_id: str, command_id: str) -> _Running:
        try:
            return self._session(session_id)[command_id]
        except KeyError:
            raise _daemon_error(
                f"command {command_id} not found", 404, "PROCESS_NOT_FOUND"
            ) from None

    async def get_session_command(
        self, session_id: str, command_id: str, request_timeout: float | None = None
    ) -> Command:
        self._sandbox.enter("get_session_command", command_id)
        running = self._command(session_id, command_id)
        code = running.task.result()[0] if running.task.done() else None
        return Command(command=running.command, exit_code=code, id=command_id)

    async def get_session_command_logs(
        self, session_id: str, command_id: str, request_timeout: float | None = None
    ) -> SessionCommandLogsResponse:
        self._sandbox.enter("get_session_command_logs", command_id)
        running = self._command(session_id, command_id)
        if not running.task.done():
            return SessionCommandLogsResponse(output="", stdout="", stderr="")
        text = running.task.result()[1].decode("utf-8", errors="replace")
        return SessionCommandLogsResponse(output=text, stdout=text, stderr="")

    async def delete_session(self, session_id: str, request_timeout: float | None = None) -> None:
        self._sandbox.enter("delete_session", session_id)
        self._session(session_id)
        del self.sessions[session_id]


class FakeFileSystem:
    """``sandbox.fs``: uploads fail when the parent directory is missing."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def _resolve(self, path: str) -> str:
        return os.path.join(self._sandbox.home, path)

    async def upload_file(self, src: str | bytes, dst: str, timeout: int = 30 * 60) -> None:
        self._sandbox.enter("upload_file", dst)
        data = src if isinstance(src, bytes) else Path(src).read_bytes()
        target = self._resolve(dst)
        try:
            with open(target, "wb") as f:
                f.write(data)
        except FileNotFoundError:
            raise _daemon_error(
                f"no such directory: {os.path.dirname(target)}", 404, "FILE_NOT_FOUND"
            ) from None
        except OSError as exc:
            raise _daemon_error(
                f"cannot write {target}: {exc.strerror}", 400, "INVALID_FILE_PATH"
            ) from None

    async def download_file(self, *args: Any) -> bytes:
        self._sandbox.enter("download_file", args[0])
        target = self._resolve(args[0])
        try:
            with open(target, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise _daemon_error(f"file not found: {target}", 404, "FILE_NOT_FOUND") from None
        except OSError as exc:
            raise _daemon_error(
                f"cannot read {target}: {exc.strerror}", 400, "INVALID_FILE_PATH"
            ) from None

    async def list_files(
        self, path: str, depth: int | None = None, request_timeout: float | None = None
    ) -> list[ToolboxFileInfo]:
        self._sandbox.enter("list_files", path)
        target = self._resolve(path)
        try:
            entries = list(os.scandir(target))
        except FileNotFoundError:
            raise _daemon_error(f"directory not found: {target}", 404, "FILE_NOT_FOUND") from None
        except OSError as exc:
            raise _daemon_error(
                f"cannot list {target}: {exc.strerror}", 400, "INVALID_FILE_PATH"
            ) from None
        infos = []
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            infos.append(
                ToolboxFileInfo(
                    group="root",
                    is_dir=entry.is_dir(),
                    mod_time="",
                    mode=oct(st.st_mode),
                    name=entry.name,
                    owner="root",
                    path=entry.path,
                    permissions=oct(st.st_mode & 0o777),
                    size=st.st_size,
                )
            )
        return infos


class FakeSandbox:
    """``AsyncSandbox`` as the client returns it."""

    def __init__(self, client: FakeDaytona, sandbox_id: str, params: Any) -> None:
        self._client = client
        self.id = sandbox_id
        self.params = params
        self.labels = dict(params.labels or {})
        self.state = "started"
        self.home = tempfile.mkdtemp(prefix=f"fake-daytona-{sandbox_id}-", dir=client.root)
        self.process = FakeProcess(self)
        self.fs = FakeFileSystem(self)
        self._running: set[_Running] = set()

    def enter(self, method: str, detail: Any) -> None:
        """Record the call, raise a queued fault, and refuse calls to a deleted sandbox."""
        self._client.enter(method, detail)
        if self.state == "destroyed":
            raise DaytonaNotFoundError(f"Sandbox {self.id} not found", status_code=404)

    def start(self, command: str, *, cwd: str | None, env: dict[str, str] | None) -> _Running:
        variables = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": self.home,
            "LANG": "C.UTF-8",
            **(self.params.env_vars or {}),
            **(env or {}),
            MARKER_VARIABLE: self.id,
        }

        async def run() -> tuple[int, bytes]:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=os.path.join(self.home, cwd) if cwd else self.home,
                env=variables,
                start_new_session=True,
            )
            output, _ = await proc.communicate()
            code = proc.returncode if proc.returncode is not None else -1
            return (128 - code if code < 0 else code), output

        running = _Running(command, asyncio.ensure_future(run()))
        self._running.add(running)
        running.task.add_done_callback(lambda _: self._running.discard(running))
        return running

    async def delete(self, timeout: float | None = 60, wait: bool = False) -> None:
        self.enter("delete", self.id)
        await self.destroy()

    async def destroy(self) -> None:
        self.state = "destroyed"
        self._client.sandboxes.pop(self.id, None)
        for _ in range(3):
            pids = _processes_of(self.id)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        pending = [r.task for r in self._running if r.task.get_loop() is loop]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        shutil.rmtree(self.home, ignore_errors=True)


def _uploaded(image: Image) -> tuple[str, dict[str, bytes]]:
    """What ``create`` sends for a declarative ``Image``: its Dockerfile, and each context
    entry read from this machine as the SDK's upload reads it (a folder file by file), by
    archive path; a missing source fails as the upload would."""
    files: dict[str, bytes] = {}
    for context in image._context_list:
        source = Path(context.source_path)
        if source.is_dir():
            for file in sorted(p for p in source.rglob("*") if p.is_file()):
                name = f"{context.archive_path.rstrip('/')}/{file.relative_to(source)}"
                files[name] = file.read_bytes()
        else:
            files[context.archive_path] = source.read_bytes()
    return image.dockerfile(), files


class FakeDaytona:
    """``AsyncDaytona`` over local subprocesses."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = str(root)
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.created: list[CreateSandboxFromImageParams | CreateSandboxFromSnapshotParams] = []
        self.builds: list[tuple[str, dict[str, bytes]]] = []
        self.create_timeouts: list[float] = []
        self.faults: dict[str, list[BaseException]] = defaultdict(list)
        self.calls: list[tuple[str, Any]] = []
        self.closed = False
        self._ids = itertools.count(1)

    def enter(self, method: str, detail: Any) -> None:
        self.calls.append((method, detail))
        queue = self.faults.get(method)
        if queue:
            raise queue.pop(0)

    def calls_to(self, method: str) -> list[Any]:
        return [detail for name, detail in self.calls if name == method]

    async def create(
        self,
        params: CreateSandboxFromImageParams | CreateSandboxFromSnapshotParams | None = None,
        *,
        timeout: float = 60,
        on_snapshot_create_logs: Any = None,
    ) -> FakeSandbox:
        self.enter("create", params)
        image = getattr(params, "image", None)
        if image is not None and not isinstance(image, str):
            self.builds.append(_uploaded(image))
        self.created.append(params)
        self.create_timeouts.append(timeout)
        sandbox = FakeSandbox(self, f"sb{next(self._ids)}", params)
        self.sandboxes[sandbox.id] = sandbox
        return sandbox

    async def get(
        self, sandbox_id_or_name: str, request_timeout: float | None = None
    ) -> FakeSandbox:
        self.enter("get", sandbox_id_or_name)
        try:
            return self.sandboxes[sandbox_id_or_name]
        except KeyError:
            raise DaytonaNotFoundError(
                f"Sandbox {sandbox_id_or_name} not found", status_code=404
            ) from None

    async def list(
        self, query: ListSandboxesQuery | None = None, request_timeout: float | None = None
    ) -> AsyncIterator[FakeSandbox]:
        self.enter("list", query)
        wanted = (query.labels if query else None) or {}
        for sandbox in list(self.sandboxes.values()):
            if all(sandbox.labels.get(k) == v for k, v in wanted.items()):
                yield sandbox

    async def delete(self, sandbox: FakeSandbox, timeout: float = 60, wait: bool = False) -> None:
        await sandbox.delete(timeout, wait=wait)

    async def close(self) -> None:
        self.closed = True

    async def destroy_all(self) -> None:
        """Tear down every sandbox still standing (test cleanup)."""
        for sandbox in list(self.sandboxes.values()):
            await sandbox.destroy()
