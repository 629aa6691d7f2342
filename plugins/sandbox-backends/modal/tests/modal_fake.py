"""A stand-in for the ``modal`` module that runs sandboxes as local processes.

It has the SDK's shape where the backend touches it: ``App.lookup``, ``Sandbox.create`` and
``Sandbox.list`` called through ``.aio``; sandbox handles with ``exec``, ``poll``,
``terminate``, ``get_tags`` and ``filesystem.*``; processes with ``stdout`` / ``stderr``
streams that iterate asynchronously and ``wait()``. Results are the SDK's own types
(``modal.types.FileInfo``) and failures its own exceptions (``modal.exception.*``).

A sandbox is a private temporary root (its ``HOME`` and ``TMPDIR``); each ``exec`` is a
subprocess, and ``terminate`` kills every process the sandbox started (found by a marker
variable in their environment, which survives ``setsid``), as stopping a container would.
Paths are the host's. ``exec(timeout=n)`` behaves like Modal's: after ``n`` seconds
``wait()`` returns -1 and the streams end, while the process keeps running. Every call is
recorded in ``calls``; ``fail(name, exc)`` makes the next call of ``name`` (``"App.lookup"``,
``"Sandbox.create"``, ``"exec"``, ``"read_bytes"`` ...) raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modal import exception as mx
from modal._utils.docker_utils import extract_copy_command_patterns
from modal._utils.name_utils import check_tag_dict
from modal.file_pattern_matcher import FilePatternMatcher
from modal.types import FileInfo, FileType

MARKER_VARIABLE = "FAKE_MODAL_SANDBOX"


class _Method:
    """``obj.method.aio(...)`` awaits the coroutine function; the blocking call is refused,
    since the backend must use the async API."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.aio = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the blocking modal API was called; use .aio")


def aio(fn: Callable[..., Any]) -> property:
    return property(lambda self: _Method(fn.__get__(self)))


@dataclass(frozen=True)
class FakeImage:
    """What the backend asked for: ``("from_registry", tag)``, ``("from_dockerfile", text)``
    or ``("debian_slim",)``. For a Dockerfile, ``context_dir`` is the build context it was
    given (``None``: Modal would use the current directory) and ``context_files`` the files
    of it Modal would send, as paths relative to it: those its ``COPY`` sources match, by the
    SDK's own rules."""

    source: tuple[str, ...]
    context_dir: Path | None = field(default=None, compare=False)
    context_files: tuple[str, ...] = field(default=(), compare=False)


class FakeImages:
    def from_registry(self, tag: str, *args: Any, **kwargs: Any) -> FakeImage:
        return FakeImage(("from_registry", tag))

    def from_dockerfile(
        self,
        path: str | os.PathLike[str],
        *,
        context_dir: Path | str | None = None,
        **kwargs: Any,
    ) -> FakeImage:
        text = Path(path).read_text()
        if context_dir is None:
            return FakeImage(("from_dockerfile", text))
        root = Path(context_dir)
        if not root.is_dir():
            raise mx.InvalidError(f"context_dir {root} is not a directory")
        patterns = extract_copy_command_patterns(text.splitlines())
        matcher = FilePatternMatcher(*patterns) if patterns else None
        files = sorted(
            str(file.relative_to(root))
            for file in root.rglob("*")
            if file.is_file() and matcher is not None and matcher(file.relative_to(root))
        )
        return FakeImage(("from_dockerfile", text), context_dir=root, context_files=tuple(files))

    def debian_slim(self, python_version: str | None = None) -> FakeImage:
        return FakeImage(("debian_slim",))


@dataclass
class FakeApp:
    name: str
    app_id: str


def close_transport(proc: asyncio.subprocess.Process) -> None:
    """Close the subprocess transport while its loop runs; one left to the garbage collector
    after the loop closed raises from its destructor."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


class FakeStream:
    """An output stream: async iteration yields byte chunks until EOF or the deadline."""

    def __init__(self, reader: asyncio.StreamReader, deadline: float | None) -> None:
        self._reader = reader
        self._deadline = deadline

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            remaining = None if self._deadline is None else self._deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            try:
                chunk = await asyncio.wait_for(self._reader.read(1 << 16), remaining)
            except TimeoutError:
                return
            if not chunk:
                return
            yield chunk

    @property
    def read(self) -> _Method:
        async def read() -> bytes:
            return b"".join([chunk async for chunk in self])

        return _Method(read)


class FakeProcess:
    def __init__(self, proc: asyncio.subprocess.Process, deadline: float | None) -> None:
        self._proc = proc
        self._deadline = deadline
        self.stdout = FakeStream(proc.stdout, deadline)  # type: ignore[arg-type]
        self.stderr = FakeStream(proc.stderr, deadline)  # type: ignore[arg-type]
        self._returncode: int | None = None

    @aio
    async def wait(self) -> int:
        if self._returncode is not None:
            return self._returncode
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        try:
            code = await asyncio.wait_for(asyncio.shield(self._proc.wait()), remaining)
        except TimeoutError:
            self._returncode = -1
            return -1
        self._returncode = 128 - code if code < 0 else code
        close_transport(self._proc)
        return self._returncode


class FakeFilesystem:
    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def _check(self, name: str, path: str) -> Path:
        self._sandbox._enter(name)
        if not path.startswith("/"):
            raise mx.InvalidError(
                f"Sandbox.filesystem.{name}() currently only supports absolute remote_path values"
            )
        return Path(path)

    @staticmethod
    @contextlib.contextmanager
    def _os_errors(path: Path) -> Any:
        try:
            yield
        except FileNotFoundError as exc:
            raise mx.SandboxFilesystemNotFoundError(f"No such file or directory: {path}") from exc
        except IsADirectoryError as exc:
            raise mx.SandboxFilesystemIsADirectoryError(f"Is a directory: {path}") from exc
        except NotADirectoryError as exc:
            raise mx.SandboxFilesystemNotADirectoryError(f"Not a directory: {path}") from exc
        except PermissionError as exc:
            raise mx.SandboxFilesystemPermissionError(f"Permission denied: {path}") from exc
        except OSError as exc:
            raise mx.SandboxFilesystemError(f"{exc}: {path}") from exc

    @aio
    async def read_bytes(self, remote_path: str) -> bytes:
        path = self._check("read_bytes", remote_path)
        with self._os_errors(path):
            return path.read_bytes()

    @aio
    async def write_bytes(self, data: bytes, remote_path: str) -> None:
        path = self._check("write_bytes", remote_path)
        with self._os_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    @aio
    async def make_directory(self, remote_path: str, *, create_parents: bool = True) -> None:
        path = self._check("make_directory", remote_path)
        with self._os_errors(path):
            path.mkdir(parents=create_parents, exist_ok=create_parents)

    @aio
    async def list_files(self, remote_path: str) -> list[FileInfo]:
        path = self._check("list_files", remote_path)
        with self._os_errors(path):
            entries = []
            for entry in os.scandir(path):
                st = entry.stat(follow_symlinks=False)
                kind = (
                    FileType.SYMLINK
                    if entry.is_symlink()
                    else FileType.DIRECTORY
                    if entry.is_dir()
                    else FileType.FILE
                )
                entries.append(
                    FileInfo(
                        name=entry.name,
                        path=entry.path,
                        type=kind,
                        size=st.st_size,
                        mode=st.st_mode,
                        permissions=oct(st.st_mode & 0o777),
                        owner=str(st.st_uid),
                        group=str(st.st_gid),
                        modified_time=st.st_mtime,
                        symlink_target=None,
                    )
                )
            return entries


class FakeSandbox:
    def __init__(self, modal: FakeModal, object_id: str, kwargs: dict[str, Any]) -> None:
        self._modal = modal
        self.object_id = object_id
        self.create_kwargs = kwargs
        self.app = kwargs["app"]
        self.tags = dict(kwargs.get("tags") or {})
        self.root = Path(tempfile.mkdtemp(prefix=f"fake-modal-{object_id}-"))
        (self.root / "tmp").mkdir()
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.root),
            "TMPDIR": str(self.root / "tmp"),
            "LANG": "C.UTF-8",
            **{k: v for k, v in (kwargs.get("env") or {}).items() if v is not None},
            MARKER_VARIABLE: str(self.root),
        }
        self.workdir = kwargs.get("workdir") or str(self.root)
        self.filesystem = FakeFilesystem(self)
        self.terminated = False
        self.exec_calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self._procs: list[asyncio.subprocess.Process] = []

    def _enter(self, name: str) -> None:
        self._modal._maybe_fail(name)
        if self.terminated:
            raise mx.SandboxTerminatedError(f"Sandbox {self.object_id} has been terminated")

    @aio
    async def exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: bool = True,
        **kwargs: Any,
    ) -> FakeProcess:
        self._enter("exec")
        self.exec_calls.append((args, {"timeout": timeout, "text": text, **kwargs}))
        if text:
            raise AssertionError("the backend must read bytes (text=False)")
        if timeout is not None and not isinstance(timeout, int):
            raise mx.InvalidError(f"timeout must be an int, got {timeout!r}")
        for arg in args:
            if "\0" in arg:
                raise mx.InvalidError("exec arguments cannot contain NUL")
        os.makedirs(self.workdir, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir or self.workdir,
            env={**self.env, **{k: v for k, v in (env or {}).items() if v is not None}},
            start_new_session=True,
        )
        self._procs.append(proc)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._modal.exec_deadline_s is not None:
            deadline = time.monotonic() + self._modal.exec_deadline_s
        return FakeProcess(proc, deadline)

    @aio
    async def poll(self) -> int | None:
        self._modal._maybe_fail("poll")
        return 137 if self.terminated else None

    @aio
    async def get_tags(self) -> dict[str, str]:
        return dict(self.tags)

    @aio
    async def terminate(self, *, wait: bool = False) -> None:
        self._modal._maybe_fail("terminate")
        if self.terminated:
            return
        self.terminated = True
        self.kill_processes()
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            close_transport(proc)
        shutil.rmtree(self.root, ignore_errors=True)

    def kill_processes(self) -> None:
        """SIGKILL every process whose environment carries this sandbox's marker."""
        needle = f"{MARKER_VARIABLE}={self.root}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                variables = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in variables:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)


class FakeApps:
    def __init__(self, modal: FakeModal) -> None:
        self._modal = modal

    @aio
    async def lookup(
        self,
        name: str,
        *,
        client: Any = None,
        environment_name: str | None = None,
        create_if_missing: bool = False,
    ) -> FakeApp:
        self._modal._maybe_fail("App.lookup")
        self._modal.calls.append(("App.lookup", {"name": name, "env": environment_name}))
        apps = self._modal.apps
        if name not in apps:
            if not create_if_missing:
                raise mx.NotFoundError(f"App '{name}' not found")
            apps[name] = FakeApp(name=name, app_id=f"ap-{len(apps) + 1:04d}")
        return apps[name]


class FakeSandboxes:
    def __init__(self, modal: FakeModal) -> None:
        self._modal = modal

    @aio
    async def create(self, *args: str, **kwargs: Any) -> FakeSandbox:
        modal = self._modal
        modal.create_times.append(modal.clock())
        modal._maybe_fail("Sandbox.create")
        modal.calls.append(("Sandbox.create", kwargs))
        if not isinstance(kwargs.get("app"), FakeApp):
            raise mx.InvalidError("App has not been hydrated; pass an app from App.lookup")
        if not isinstance(kwargs.get("image"), FakeImage):
            raise mx.InvalidError(f"image must be a modal Image, got {kwargs.get('image')!r}")
        check_tag_dict(kwargs.get("tags") or {})
        for key, kind in (("timeout", int), ("memory", int), ("cpu", float)):
            if key in kwargs and not isinstance(kwargs[key], kind):
                raise mx.InvalidError(f"{key} must be {kind.__name__}, got {kwargs[key]!r}")
        sandbox = FakeSandbox(modal, f"sb-{next(modal._ids):04d}", kwargs)
        modal.sandboxes.append(sandbox)
        return sandbox

    @aio
    def list(
        self, *, app_id: str | None = None, tags: dict[str, str] | None = None, client: Any = None
    ) -> AsyncIterator[FakeSandbox]:
        """Like the SDK's, ``.aio(...)`` returns an async generator, not a coroutine."""

        async def generate() -> AsyncIterator[FakeSandbox]:
            for sb in list(self._modal.sandboxes):
                if sb.terminated or (app_id and sb.app.app_id != app_id):
                    continue
                if all(sb.tags.get(k) == v for k, v in (tags or {}).items()):
                    yield sb

        return generate()


@dataclass
class FakeModal:
    """The fake ``modal`` module. ``exec_deadline_s`` overrides every exec's deadline, to
    make Modal's -1 exit come first."""

    clock: Callable[[], float] = time.monotonic
    exec_deadline_s: float | None = None
    apps: dict[str, FakeApp] = field(default_factory=dict)
    sandboxes: list[FakeSandbox] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    create_times: list[float] = field(default_factory=list)
    failures: dict[str, list[BaseException]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self.App = FakeApps(self)
        self.Sandbox = FakeSandboxes(self)
        self.Image = FakeImages()

    def fail(self, name: str, *errors: BaseException) -> None:
        """Make the next calls of ``name`` raise ``errors``, one per call."""
        self.failures.setdefault(name, []).extend(errors)

    def _maybe_fail(self, name: str) -> None:
        pending = self.failures.get(name)
        if pending:
            raise pending.pop(0)

    async def terminate_all(self) -> None:
        for sb in self.sandboxes:
            await sb.terminate.aio()
