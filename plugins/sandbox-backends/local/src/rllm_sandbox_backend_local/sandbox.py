"""One local sandbox: running commands and moving files in and out.

Every command runs in its own session (so its own process group), started from here; on
timeout the whole group is killed with SIGKILL. With bubblewrap the command joins the
sandbox's namespaces through ``nsenter``, and closing the sandbox kills its namespace holder,
which makes the kernel kill every process left in the sandbox's PID namespace, including any
that left the command's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Literal

from rllm_core.errors import (
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
)
from rllm_core.kit.sandboxes import ClosesOnExit, command_timed_out
from rllm_core.types import ExecResult, FileInfo

from rllm_sandbox_backend_local.bwrap import exec_argv, stop_holder
from rllm_sandbox_backend_local.capture import Capture
from rllm_sandbox_backend_local.paths import PathMap
from rllm_sandbox_backend_local.processes import (
    Process,
    holder_processes,
    kill_all_but,
    namespace_of,
    processes_in,
)
from rllm_sandbox_backend_local.relay import GatewayRelay
from rllm_sandbox_backend_local.users import User, resolve_user

__all__ = ["LocalSandbox"]

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _limits(memory_bytes: int | None, file_bytes: int | None) -> Callable[[], None]:
    def apply() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _check_env(env: Mapping[str, str]) -> None:
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise SandboxError(
                f"environment variable name {key!r} is invalid: a name must be non-empty and"
                " contain neither '=' nor NUL"
            )
        if "\0" in value:
            raise SandboxError(f"environment variable {key} contains a NUL byte; remove it")


def _list(host: str, spath: str) -> list[FileInfo]:
    infos = []
    with os.scandir(host) as entries:
        for entry in entries:
            try:
                st = entry.stat()
            except OSError:
                st = entry.stat(follow_symlinks=False)
            is_dir = entry.is_dir()
            size = 0 if is_dir else st.st_size
            infos.append(FileInfo(path=os.path.join(spath, entry.name), size=size, is_dir=is_dir))
    return sorted(infos, key=lambda info: info.path)


class LocalSandbox(ClosesOnExit):
    """A sandbox on this machine; create it with :class:`~rllm_sandbox_backend_local.LocalBackend`.

    ``isolation`` is ``"bwrap"`` (own namespaces over a private root) or ``"none"`` (plain
    subprocesses on the host; see the package README for what that does not protect).
    ``private_root`` is the host directory holding the sandbox's files, removed on close.
    ``gateway_url`` is where its processes reach the gateway with ``network = "gateway"``:
    under bubblewrap a relay's URL on the sandbox's loopback (``relay``), without it the
    spec's URL itself.
    ``exec_delay_s`` is waited (``asyncio.sleep``) at the start of every ``exec``, outside its
    timeout and its ``duration_s``: a remote sandbox's round trip, emulated for benchmarks.
    """

    merges_output = False

    def __init__(
        self,
        *,
        isolation: Literal["bwrap", "none"],
        paths: PathMap,
        private_root: str,
        env: Mapping[str, str],
        user: User,
        output_limit_bytes: int,
        memory_bytes: int | None,
        file_bytes: int | None,
        lifetime_s: float,
        holder: subprocess.Popen[bytes] | None = None,
        holder_pid: int = 0,
        user_namespace: bool = False,
        network: bool = False,
        shell: str = "/bin/sh",
        exec_delay_s: float = 0.0,
        on_close: Callable[[LocalSandbox], None] | None = None,
        relay: GatewayRelay | None = None,
        gateway_url: str | None = None,
    ) -> None:
        self.isolation = isolation
        self.paths = paths
        self.private_root = private_root
        self.workdir = paths.workdir
        self.user = user
        self._env = dict(env)
        self._limit = output_limit_bytes
        self._preexec = _limits(memory_bytes, file_bytes)
        self._expires = time.monotonic() + lifetime_s
        self._lifetime_s = lifetime_s
        self._holder = holder
        self._holder_pid = holder_pid
        self._user_namespace = user_namespace
        self._network = network
        self._shell = shell
        self._exec_delay_s = exec_delay_s
        self._on_close = on_close
        self._relay = relay
        self.gateway_url = relay.inside_url if relay is not None else gateway_url
        self._groups: set[int] = set()
        self._marked: set[Process] | None = None
        self._marked_groups: set[int] = set()
        self._closed = False
        self._nsenter = shutil.which("nsenter") or "nsenter"
        self._setpriv = shutil.which("setpriv") or "setpriv"

    # ---------------------------------------------------------------- state

    def _gone_reason(self) -> str | None:
        if self._closed:
            return "it is closed"
        if time.monotonic() > self._expires:
            return f"its lifetime of {self._lifetime_s:g} s is over"
        if self._holder is not None and self._holder.poll() is not None:
            return f"its bubblewrap process exited with code {self._holder.returncode}"
        return None

    async def _check_open(self, what: str) -> None:
        reason = self._gone_reason()
        if reason is not None:
            if not self._closed:
                await self.close()
            raise SandboxGone(
                f"{what}: the sandbox at {self.private_root} is gone ({reason}); create a new one"
            )

    async def is_alive(self) -> bool:
        try:
            return self._gone_reason() is None
        except Exception:
            return False

    # ---------------------------------------------------------------- exec

    def _exec_user(self, user: str | None) -> User:
        if user is None or user in (self.user.name, str(self.user.uid)):
            return self.user
        try:
            wanted = resolve_user(user)
        except LookupError as exc:
            raise SandboxError(str(exc)) from exc
        if wanted.uid == self.user.uid:
            return wanted
        if os.geteuid() != 0:
            raise SandboxError(
                f"cannot run as user {user!r}: this process is not root, so every command of"
                f" the sandbox runs as {self.user.name!r}; leave user unset, or run as root"
            )
        return wanted

    def _command(
        self, command: str, user: User, cwd: str
    ) -> tuple[list[str], str | None, dict[str, object]]:
        """argv, host cwd and extra Popen arguments for one command."""
        if self.isolation == "bwrap":
            argv = exec_argv(
                nsenter=self._nsenter,
                setpriv=self._setpriv,
                holder_pid=self._holder_pid,
                user_namespace=self._user_namespace,
                network=self._network,
                user=None if self._user_namespace else user,
                cwd=cwd,
                shell=self._shell,
                command=command,
            )
            return argv, None, {}
        _, host_cwd = self.paths.resolve(cwd)
        extra: dict[str, object] = {}
        if user.uid != os.geteuid():
            extra = {"user": user.uid, "group": user.gid, "extra_groups": []}
        return [self._shell, "-c", command], host_cwd, extra

    def _forget(self, pgid: int) -> None:
        """Stop tracking a finished command's group, unless (without bubblewrap) something it
        started in the background still runs in it: close must kill that too."""
        if self.isolation == "none":
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                self._groups.discard(pgid)
            except PermissionError:
                pass  # it exists, run by a user this process may not signal
            return
        self._groups.discard(pgid)

    async def exec(
        self,
        command: str,
        timeout: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if self._exec_delay_s > 0:
            await asyncio.sleep(self._exec_delay_s)
        await self._check_open("exec")
        if "\0" in command:
            raise SandboxError("the command contains a NUL byte, which no shell can receive")
        who = self._exec_user(user)
        call_env = dict(env or {})
        _check_env(call_env)
        full_env = {"HOME": who.home, "USER": who.name, "LOGNAME": who.name, **self._env}
        full_env.update(call_env)
        directory = self.paths.absolute(cwd) if cwd else self.workdir
        _, host_dir = self.paths.resolve(directory)
        if not os.path.isdir(host_dir):
            raise SandboxError(
                f"cwd {directory} is not a directory in the sandbox; create it first or pass"
                " another cwd"
            )
        argv, host_cwd, extra = self._command(command, who, directory)
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            transport, capture = await loop.subprocess_exec(
                lambda: Capture(self._limit),
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=host_cwd,
                env=full_env,
                start_new_session=True,
                preexec_fn=self._preexec,
                **extra,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"could not start {command[:200]!r} in {directory}: {exc}") from exc
        pgid = transport.get_pid()
        self._groups.add(pgid)
        finished = False
        try:
            done, _ = await asyncio.wait({capture.finished}, timeout=timeout)
            finished = bool(done)
        finally:
            if not finished:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                # Every writer is dead now, so the pipes reach EOF promptly.
                await asyncio.wait({capture.finished}, timeout=5.0)
            transport.close()
            self._forget(pgid)
        if not finished:
            raise command_timed_out(command, timeout)
        code = transport.get_returncode()
        if code is None:
            raise SandboxError(f"{command[:200]!r} ended without an exit status")
        return ExecResult(
            exit_code=128 - code if code < 0 else code,
            stdout=capture.text(1),
            stderr=capture.text(2),
            truncated=capture.truncated,
            duration_s=time.monotonic() - started,
        )

    # ---------------------------------------------------------------- files

    def _chown(self, host: str) -> None:
        if os.geteuid() == 0 and self.user.uid != 0 and self.isolation == "bwrap":
            os.chown(host, self.user.uid, self.user.gid)

    def _write(self, path: str, data: bytes) -> None:
        spath, host = self.paths.resolve(path, write=True)
        parent = os.path.dirname(spath)
        missing = []
        while parent != "/":
            _, host_parent = self.paths.resolve(parent, write=True)
            if os.path.isdir(host_parent):
                break
            missing.append(host_parent)
            parent = os.path.dirname(parent)
        for host_parent in reversed(missing):
            os.makedirs(host_parent, exist_ok=True)
            self._chown(host_parent)
        with open(host, "wb") as f:
            f.write(data)
        self._chown(host)

    def _read(self, path: str) -> bytes:
        _, host = self.paths.resolve(path)
        with open(host, "rb") as f:
            return f.read()

    async def write_file(self, path: str, data: bytes) -> None:
        await self._check_open("write_file")
        try:
            await asyncio.to_thread(self._write, path, bytes(data))
        except SandboxError:
            raise
        except OSError as exc:
            raise SandboxError(f"could not write {path} in the sandbox: {exc}") from exc

    async def read_file(self, path: str) -> bytes:
        await self._check_open("read_file")
        try:
            return await asyncio.to_thread(self._read, path)
        except SandboxError:
            raise
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise SandboxFileNotFound(f"no file {path} in the sandbox") from exc
        except OSError as exc:
            raise SandboxError(f"could not read {path} in the sandbox: {exc}") from exc

    async def list_files(self, path: str) -> list[FileInfo]:
        await self._check_open("list_files")

        def listing() -> list[FileInfo]:
            spath = self.paths.absolute(path)
            _, host = self.paths.resolve(path)
            return _list(host, spath)

        try:
            return await asyncio.to_thread(listing)
        except SandboxError:
            raise
        except FileNotFoundError as exc:
            raise SandboxFileNotFound(f"no directory {path} in the sandbox") from exc
        except OSError as exc:
            raise SandboxError(f"could not list {path} in the sandbox: {exc}") from exc

    # ---------------------------------------------------------------- agent processes

    async def mark_processes(self) -> None:
        """Spare what runs now from :meth:`end_processes` (see
        :class:`~rllm_core.ports.EndsProcesses`)."""
        await self._check_open("mark_processes")
        if self.isolation == "bwrap":
            self._marked = await asyncio.to_thread(processes_in, namespace_of(self._holder_pid))
        else:
            self._marked_groups = set(self._groups)

    async def end_processes(self) -> int:
        """Kill every process started since :meth:`mark_processes` and return how many.

        Under bubblewrap these are the processes of the sandbox's PID namespace, found from
        the host, whatever session, group or user they run in. Without isolation only the
        process groups of this sandbox's commands can be found: a process that started its
        own session escapes (see the package README).
        """
        await self._check_open("end_processes")
        if self.isolation != "bwrap":
            return await asyncio.to_thread(self._kill_new_groups)
        namespace = namespace_of(self._holder_pid)
        spared = self._marked
        if spared is None:
            spared = await asyncio.to_thread(holder_processes, namespace)
        killed, left = await asyncio.to_thread(kill_all_but, namespace, spared, 5.0)
        if left:
            raise SandboxError(
                f"{len(left)} process(es) of the sandbox at {self.private_root} still ran after"
                f" 5 s of killing (host pids {sorted(pid for pid, _ in left)[:10]}); close the"
                " sandbox instead of grading it"
            )
        return killed

    def _kill_new_groups(self) -> int:
        killed = 0
        for pgid in list(self._groups - self._marked_groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
            self._groups.discard(pgid)
        return killed

    # ---------------------------------------------------------------- lifecycle

    def _kill_everything(self) -> None:
        for pgid in list(self._groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        self._groups.clear()
        if self._holder is not None:
            stop_holder(self._holder, self._holder_pid)

    def _remove_root(self) -> None:
        shutil.rmtree(self.private_root, ignore_errors=True)

    async def close(self) -> None:
        """Kill every process of the sandbox and remove its private root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._relay is not None:
            await self._relay.close()
        await asyncio.to_thread(self._kill_everything)
        await asyncio.to_thread(self._remove_root)
        if self._on_close is not None:
            self._on_close(self)
