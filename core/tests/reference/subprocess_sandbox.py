"""A sandbox backend that runs commands as local subprocesses, used to exercise the suite.

It isolates nothing: a sandbox is a working directory on this machine. What it does get right
is the process and I/O contract: each command runs ``/bin/sh -c`` in its own process group, a
timeout kills the whole group, both pipes are drained concurrently with a per-stream cap, and
closing a sandbox kills every process group its commands left behind. ``end_processes`` kills
the groups of the commands run since ``mark_processes``: a process that started a session of
its own is out of its reach. The spec's workdir is created when missing and left in place on
close.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import posixpath
import signal
import subprocess
import time
from collections.abc import Mapping

from rllm_core.errors import (
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
)
from rllm_core.kit.sandboxes import ClosesOnExit
from rllm_core.types import ExecResult, FileInfo, NetworkPolicy, SandboxSpec

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class _Capture(asyncio.SubprocessProtocol):
    """Keeps the first ``limit`` bytes of each stream and drops the rest as it arrives, so a
    writer never blocks on a full pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = {1: bytearray(), 2: bytearray()}
        self.truncated = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._open_pipes = {1, 2}
        self._exited = False

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.kept[fd]
        room = max(self.limit - len(kept), 0)
        kept += data[:room]
        self.truncated = self.truncated or len(data) > room

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        self._check_finished()

    def process_exited(self) -> None:
        self._exited = True
        self._check_finished()

    def _check_finished(self) -> None:
        if self._exited and not self._open_pipes and not self.finished.done():
            self.finished.set_result(None)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _list(path: str) -> list[FileInfo]:
    infos = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                st = entry.stat()
            except OSError:
                st = entry.stat(follow_symlinks=False)
            infos.append(FileInfo(path=entry.path, size=st.st_size, is_dir=entry.is_dir()))
    return sorted(infos, key=lambda i: i.path)


class SubprocessSandbox(ClosesOnExit):
    """One working directory and the process groups started in it. It shares this
    machine's network, so it reaches a gateway at the spec's own URL."""

    merges_output = False
    gateway_url: str | None = None

    def __init__(
        self,
        *,
        workdir: str,
        env: Mapping[str, str],
        output_limit_bytes: int,
        on_close: SubprocessBackend,
    ) -> None:
        self.workdir = workdir
        self._env = dict(env)
        self._limit = output_limit_bytes
        self._backend = on_close
        self._groups: set[int] = set()
        self._marked: set[int] = set()
        self._closed = False

    # ---------------------------------------------------------------- helpers

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SandboxGone(f"{what}: the sandbox at {self.workdir} is closed; create a new one")

    def _path(self, path: str) -> str:
        return posixpath.join(self.workdir, path)

    def _kill_tree(self, pgid: int) -> None:
        """Kill the command's process group: the shell and everything it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    def _forget_finished(self, pgid: int) -> None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            self._groups.discard(pgid)
        except PermissionError:
            pass

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
        if user is not None and user != getpass.getuser():
            raise SandboxError(
                f"cannot run as user {user!r}: the subprocess backend runs every command as"
                f" {getpass.getuser()!r}; leave user unset"
            )
        directory = self._path(cwd) if cwd else self.workdir
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            transport, capture = await loop.subprocess_exec(
                lambda: _Capture(self._limit),
                "/bin/sh",
                "-c",
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=directory,
                env={**self._env, **(env or {})},
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            raise SandboxError(f"could not start {command[:200]!r} in {directory}: {exc}") from exc
        pgid = transport.get_pid()
        self._groups.add(pgid)
        finished = False
        try:
            done, _ = await asyncio.wait({capture.finished}, timeout=timeout)
            finished = bool(done)
        finally:
            if not finished:
                self._kill_tree(pgid)
                # Every writer is dead now, so the pipes reach EOF promptly.
                await asyncio.wait({capture.finished}, timeout=2.0)
            transport.close()
        if not finished:
            raise SandboxCommandTimeout(
                f"{command[:200]!r} ran past its {timeout:g} s timeout and was killed;"
                " raise the timeout or make the command finish sooner",
                command=command,
                timeout_s=timeout,
            )
        self._forget_finished(pgid)
        code = transport.get_returncode()
        assert code is not None
        return ExecResult(
            exit_code=128 - code if code < 0 else code,
            stdout=capture.kept[1].decode("utf-8", errors="replace"),
            stderr=capture.kept[2].decode("utf-8", errors="replace"),
            truncated=capture.truncated,
            duration_s=time.monotonic() - started,
        )

    # ---------------------------------------------------------------- files

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open("write_file")
        target = self._path(path)
        try:
            await asyncio.to_thread(_write, target, bytes(data))
        except OSError as exc:
            raise SandboxError(f"could not write {target}: {exc}") from exc

    async def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        target = self._path(path)
        try:
            return await asyncio.to_thread(_read, target)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise SandboxFileNotFound(f"no file {target} in the sandbox") from exc
        except OSError as exc:
            raise SandboxError(f"could not read {target}: {exc}") from exc

    async def list_files(self, path: str) -> list[FileInfo]:
        self._check_open("list_files")
        target = self._path(path)
        try:
            return await asyncio.to_thread(_list, target)
        except FileNotFoundError as exc:
            raise SandboxFileNotFound(f"no directory {target} in the sandbox") from exc
        except OSError as exc:
            raise SandboxError(f"could not list {target}: {exc}") from exc

    # ---------------------------------------------------------------- agent processes

    async def mark_processes(self) -> None:
        self._check_open("mark_processes")
        self._marked = set(self._groups)

    async def end_processes(self) -> int:
        self._check_open("end_processes")
        killed = 0
        for pgid in self._groups - self._marked:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
            self._groups.discard(pgid)
        return killed

    # ---------------------------------------------------------------- lifecycle

    async def is_alive(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in self._groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        self._groups.clear()
        self._backend.forget(self)


class SubprocessBackend:
    """Creates :class:`SubprocessSandbox` es; ``output_limit_bytes`` caps each stream."""

    sandbox_class: type[SubprocessSandbox] = SubprocessSandbox

    def __init__(self, *, output_limit_bytes: int = 1 << 20) -> None:
        self.output_limit_bytes = output_limit_bytes
        self._sandboxes: list[SubprocessSandbox] = []

    async def create(self, spec: SandboxSpec) -> SubprocessSandbox:
        if spec.image or spec.dockerfile:
            raise SandboxCreateError(
                f"the subprocess backend cannot run image {spec.image or spec.dockerfile!r};"
                " leave image and dockerfile unset or choose a container backend"
            )
        if spec.user is not None and spec.user != getpass.getuser():
            raise SandboxCreateError(
                f"the subprocess backend cannot run as user {spec.user!r}; leave user unset"
            )
        workdir = os.path.abspath(spec.workdir)
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as exc:
            raise SandboxCreateError(f"cannot create workdir {workdir}: {exc}") from exc
        env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": workdir, "LANG": "C.UTF-8"}
        sandbox = self.sandbox_class(
            workdir=workdir,
            env={**env, **spec.env},
            output_limit_bytes=self.output_limit_bytes,
            on_close=self,
        )
        if spec.network is NetworkPolicy.GATEWAY:
            sandbox.gateway_url = spec.gateway_url
        self._sandboxes.append(sandbox)
        return sandbox

    def forget(self, sandbox: SubprocessSandbox) -> None:
        if sandbox in self._sandboxes:
            self._sandboxes.remove(sandbox)

    async def close(self) -> None:
        for sandbox in list(self._sandboxes):
            await sandbox.close()
