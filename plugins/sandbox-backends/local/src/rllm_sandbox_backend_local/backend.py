"""The ``local`` sandbox backend: creates :class:`LocalSandbox` es on this machine."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any, Literal

from rllm_core.errors import SandboxCreateError, SandboxStartTimeout
from rllm_core.types import NetworkPolicy, SandboxSpec

from rllm_sandbox_backend_local.bwrap import (
    READY,
    VIRTUAL_DIRS,
    Layout,
    holder_argv,
    probe,
    stop_holder,
)
from rllm_sandbox_backend_local.paths import PathMap
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig
from rllm_sandbox_backend_local.relay import GatewayRelay, gateway_address
from rllm_sandbox_backend_local.sandbox import LocalSandbox
from rllm_sandbox_backend_local.users import User, current_user, resolve_user

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INSTALL = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
)
_START_TIMEOUT_S = 20.0


def _read_until(fd: int, end: float, done: Callable[[bytes], bool]) -> bytes:
    """Read ``fd`` until ``done(data)``, end of file or the monotonic time ``end``."""
    data = b""
    while not done(data):
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("bubblewrap did not start the sandbox in time")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def _parses(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _wait_started(info_fd: int, stdout_fd: int, deadline_s: float) -> tuple[int | None, bool]:
    """The host pid of the sandbox's init from bwrap's ``--info-fd`` (``None`` when bwrap
    failed before reporting it), and whether the holder then printed its ready line."""
    end = time.monotonic() + deadline_s
    info = _read_until(info_fd, end, _parses)
    pid = json.loads(info).get("child-pid") if _parses(info) else None
    if not isinstance(pid, int):
        return None, False
    line = _read_until(stdout_fd, end, lambda data: b"\n" in data)
    return pid, line.strip() == READY.encode()


class LocalBackend:
    """Creates sandboxes on this machine, isolated with bubblewrap when it works.

    ``isolation`` is ``None`` until the first ``create`` decides it, then ``"bwrap"`` or
    ``"none"``; ``fallback_reason`` says why bubblewrap is not used. The first sandbox created
    without isolation logs one WARNING with that reason and how to install bubblewrap.
    """

    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        self.config = config or LocalSandboxConfig()
        self.isolation: Literal["bwrap", "none"] | None = None
        self.fallback_reason: str | None = None
        self._sandboxes: list[LocalSandbox] = []
        self._layout: Layout | None = None
        self._warned = False

    # ---------------------------------------------------------------- isolation mode

    def _decide(self) -> Literal["bwrap", "none"]:
        if self.isolation is not None:
            return self.isolation
        wanted = self.config.isolation
        if wanted == "none":
            self.fallback_reason = "isolation = 'none' is configured"
            self.isolation = "none"
            return "none"
        reason = probe(self.config.bwrap)
        if reason is None:
            self.isolation = "bwrap"
            self._layout = Layout.of_host(self.config.extra_ro_binds)
            return "bwrap"
        if wanted == "bwrap":
            raise SandboxCreateError(
                f"isolation = 'bwrap' but bubblewrap is unusable: {reason}; {_INSTALL} and make"
                " sure unprivileged user namespaces are enabled, or set isolation = 'auto' to"
                " accept unisolated sandboxes"
            )
        self.fallback_reason = reason
        self.isolation = "none"
        return "none"

    def _warn_unisolated(self) -> None:
        if self._warned or self.config.isolation == "none":
            return
        self._warned = True
        logger.warning(
            "local sandboxes are NOT isolated: %s. Commands run as plain processes on this"
            " machine, see its files and network, and only the workdir is their own. To isolate"
            " them, %s, or set isolation = 'bwrap' to fail instead of falling back.",
            self.fallback_reason,
            _INSTALL,
        )

    # ---------------------------------------------------------------- create

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        if self.config.start_delay_s > 0:
            await asyncio.sleep(self.config.start_delay_s)
        mode = self._decide()
        if not spec.workdir.startswith("/"):
            raise SandboxCreateError(
                f"workdir {spec.workdir!r} must be an absolute path, such as /workspace"
            )
        if spec.network is NetworkPolicy.GATEWAY and spec.gateway_url is not None:
            gateway_address(spec.gateway_url)
        try:
            user = resolve_user(spec.user) if spec.user is not None else current_user()
        except LookupError as exc:
            raise SandboxCreateError(str(exc)) from exc
        if spec.image or spec.dockerfile:
            logger.debug(
                "the local backend runs on this machine's system directories; image %r is not used",
                spec.image,
            )
        root_dir = str(self.config.root_dir) if self.config.root_dir else None
        try:
            if root_dir:
                os.makedirs(root_dir, exist_ok=True)
            private = tempfile.mkdtemp(prefix="rllm-sandbox-", dir=root_dir)
        except OSError as exc:
            raise SandboxCreateError(
                f"cannot create a private root under {root_dir or tempfile.gettempdir()}: {exc};"
                " set root_dir to a writable directory"
            ) from exc
        try:
            if mode == "bwrap":
                sandbox = await self._create_bwrap(spec, user, private)
            else:
                sandbox = self._create_plain(spec, user, private)
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        self._sandboxes.append(sandbox)
        return sandbox

    def _sandbox(self, spec: SandboxSpec, user: User, **isolation: Any) -> LocalSandbox:
        """The sandbox for ``spec``: the settings both isolation modes share, plus
        ``isolation`` (the mode, paths, env and, under bubblewrap, its holder process)."""
        rlimits = self.config.rlimits
        return LocalSandbox(
            user=user,
            output_limit_bytes=self.config.output_limit_bytes,
            memory_bytes=spec.memory_mb * (1 << 20) if rlimits else None,
            file_bytes=spec.disk_mb * (1 << 20) if rlimits else None,
            lifetime_s=spec.lifetime_s,
            shell="/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh",
            exec_delay_s=self.config.exec_delay_s,
            on_close=self._forget,
            **isolation,
        )

    def _create_plain(self, spec: SandboxSpec, user: User, private: str) -> LocalSandbox:
        if user.uid != os.geteuid() and os.geteuid() != 0:
            raise SandboxCreateError(
                f"cannot run sandbox commands as user {spec.user!r}: this process is not root;"
                " leave user unset"
            )
        self._warn_unisolated()
        workdir = os.path.normpath(spec.workdir)
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as exc:
            raise SandboxCreateError(
                f"cannot create workdir {workdir} on this machine: {exc}; without bubblewrap"
                f" the workdir is a real directory here, so choose a writable path or {_INSTALL}"
            ) from exc
        env = {
            "PATH": os.environ.get("PATH", _PATH),
            "HOME": workdir,
            "LANG": "C.UTF-8",
            **spec.env,
        }
        gateway_url = spec.gateway_url if spec.network is NetworkPolicy.GATEWAY else None
        return self._sandbox(
            spec,
            user,
            isolation="none",
            gateway_url=gateway_url,
            paths=PathMap(root=private, workdir=workdir, isolated=False),
            private_root=private,
            env=env,
        )

    async def _create_bwrap(self, spec: SandboxSpec, user: User, private: str) -> LocalSandbox:
        assert self._layout is not None
        root = os.path.join(private, "root")
        workdir = os.path.normpath(spec.workdir)
        paths = PathMap(
            root=root,
            workdir=workdir,
            isolated=True,
            readonly=self._layout.readonly,
            virtual=VIRTUAL_DIRS,
        )
        if paths.is_readonly(workdir) or workdir in VIRTUAL_DIRS or workdir == "/":
            raise SandboxCreateError(
                f"workdir {workdir} is a read-only system directory in a local sandbox; choose"
                " another path, such as /workspace"
            )
        if os.geteuid() != 0 and user.uid != os.geteuid():
            raise SandboxCreateError(
                f"cannot run sandbox commands as user {spec.user!r}: this process is not root,"
                " so a sandbox's only user is the current one; leave user unset or run as root"
            )
        owned = os.geteuid() == 0 and user.uid != 0
        try:
            os.makedirs(root)
            # bwrap would create missing mount-point parents mode 0700, hiding /etc from
            # every user but root.
            for path in (*self._layout.readonly, "/dev/shm"):
                parent = os.path.dirname(path)
                while parent != "/" and not os.path.isdir(root + parent):
                    os.makedirs(root + parent, mode=0o755)
                    os.chmod(root + parent, 0o755)
                    parent = os.path.dirname(parent)
            tmp = os.path.join(root, "tmp")
            os.makedirs(tmp, exist_ok=True)
            os.chmod(tmp, 0o1777)
            for directory in {workdir, user.home}:
                if directory == "/" or paths.is_readonly(directory):
                    continue
                host = root + directory
                os.makedirs(host, exist_ok=True)
                if owned:
                    os.chown(host, user.uid, user.gid)
        except OSError as exc:
            raise SandboxCreateError(f"cannot prepare the private root {root}: {exc}") from exc
        user_namespace = os.geteuid() != 0
        info_read, info_write = os.pipe()
        out_read, out_write = os.pipe()
        log_path = os.path.join(private, "bwrap.log")
        argv = holder_argv(
            shutil.which(self.config.bwrap) or self.config.bwrap,
            root=root,
            layout=self._layout,
            network=spec.network is NetworkPolicy.FULL,
            user_namespace=user_namespace,
            info_fd=info_write,
            sleep=shutil.which("sleep") or "/bin/sleep",
        )
        # Started from the event loop's thread, not a worker thread: --die-with-parent fires
        # when the thread that forked bwrap exits, and worker threads come and go.
        try:
            with open(log_path, "wb") as log:
                holder = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out_write,
                    stderr=log,
                    pass_fds=(info_write,),
                    env={"PATH": _PATH},
                    start_new_session=True,
                )
        except OSError as exc:
            for fd in (info_read, info_write, out_read, out_write):
                os.close(fd)
            raise SandboxCreateError(f"cannot start bubblewrap ({argv[0]}): {exc}") from exc
        os.close(info_write)
        os.close(out_write)
        failure: str | None = None
        pid: int | None = None
        ready = timed_out = False
        try:
            pid, ready = await asyncio.to_thread(
                _wait_started, info_read, out_read, _START_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            failure = str(exc)
            timed_out = isinstance(exc, TimeoutError)
        finally:
            os.close(info_read)
            os.close(out_read)
        if pid is None or not ready:
            stop_holder(holder, pid)
            with open(log_path, "rb") as f:
                detail = f.read().decode(errors="replace").strip()
            error = SandboxStartTimeout if timed_out else SandboxCreateError
            raise error(
                "bubblewrap could not start the sandbox: "
                + (detail or failure or f"exit code {holder.returncode}")
            )
        relay: GatewayRelay | None = None
        if spec.network is NetworkPolicy.GATEWAY and spec.gateway_url is not None:
            try:
                relay = await GatewayRelay.open(
                    spec.gateway_url, holder_pid=pid, user_namespace=user_namespace
                )
            except BaseException:
                stop_holder(holder, pid)
                raise
        return self._sandbox(
            spec,
            user,
            isolation="bwrap",
            paths=paths,
            private_root=private,
            env={"PATH": _PATH, "LANG": "C.UTF-8", **spec.env},
            holder=holder,
            holder_pid=pid,
            user_namespace=user_namespace,
            network=spec.network is NetworkPolicy.FULL,
            relay=relay,
        )

    # ---------------------------------------------------------------- close

    def _forget(self, sandbox: LocalSandbox) -> None:
        if sandbox in self._sandboxes:
            self._sandboxes.remove(sandbox)

    async def close(self) -> None:
        """Close every sandbox this backend still holds. Idempotent."""
        for sandbox in list(self._sandboxes):
            await sandbox.close()
