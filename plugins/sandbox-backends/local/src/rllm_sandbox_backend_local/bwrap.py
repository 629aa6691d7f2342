"""The bubblewrap command lines: the namespace holder of a sandbox, and commands run in it.

A sandbox is one long-lived ``bwrap`` process (the *holder*) that owns the sandbox's mount,
PID, IPC, UTS and network namespaces and keeps them alive with ``sleep infinity``.
Every command joins those namespaces with ``nsenter``, so all commands of a sandbox share one
process table (a pid written by one command means the same process to the next) and one
filesystem view, while no sandbox sees another's or the host's processes. ``setpriv`` then
empties the capability bounding set, sets no-new-privs and switches to the command's user
before the shell starts, so even root inside cannot remount the read-only system directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from rllm_sandbox_backend_local.users import User

__all__ = [
    "ETC_ENTRIES",
    "READY",
    "SYSTEM_DIRS",
    "VIRTUAL_DIRS",
    "Layout",
    "dev_args",
    "exec_argv",
    "holder_argv",
    "probe",
    "stop_holder",
]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Host directories every sandbox sees read-only (those that exist on the host)."""

ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "environment",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki",
    "profile",
    "profile.d",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
    "terminfo",
    "timezone",
)
"""Entries of the host's ``/etc`` bound read-only: what a shell, the dynamic loader, user
lookup, TLS and name resolution need. The rest of ``/etc`` is the sandbox's own."""

VIRTUAL_DIRS = ("/proc", "/dev")

READY = "rllm-sandbox-ready"

# `cd` first so that a missing cwd fails the command instead of running it elsewhere.
_ENTER = 'cd -- "$1" || exit 1; shift; exec "$@"'


@dataclass(frozen=True, slots=True)
class Layout:
    """The host paths a sandbox sees read-only, as bwrap arguments and as sandbox paths."""

    args: tuple[str, ...]
    readonly: tuple[str, ...]

    @classmethod
    def of_host(cls, extra_ro_binds: Sequence[str] = ()) -> Layout:
        args: list[str] = []
        readonly: list[str] = []
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
            else:
                continue
            readonly.append(path)
        for name in ETC_ENTRIES:
            path = f"/etc/{name}"
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
                readonly.append(path)
        for path in extra_ro_binds:
            path = os.path.normpath(path)
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
                readonly.append(path)
        return cls(args=tuple(args), readonly=tuple(readonly))


def holder_argv(
    bwrap: str,
    *,
    root: str,
    layout: Layout,
    network: bool,
    user_namespace: bool,
    info_fd: int,
    sleep: str,
) -> list[str]:
    """The holder of a sandbox whose ``/`` is ``root``.

    ``user_namespace`` is set when this process is not root: bwrap then needs a user
    namespace, in which only the caller's own uid and gid exist.
    """
    argv = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        "sandbox",
    ]
    if not network:
        argv.append("--unshare-net")
    if user_namespace:
        argv.append("--unshare-user")
    argv += ["--bind", root, "/", *layout.args, "--proc", "/proc", *dev_args(user_namespace)]
    # The line on stdout tells the backend that the mounts are complete: bwrap reports the
    # child's pid before it has set up the sandbox's filesystem.
    argv += [
        "--info-fd",
        str(info_fd),
        "--",
        "/bin/sh",
        "-c",
        f"echo {READY} && exec {sleep} infinity",
    ]
    return argv


def dev_args(user_namespace: bool) -> list[str]:
    """The sandbox's ``/dev``.

    As root, bwrap's own minimal ``/dev``. In a user namespace that ``/dev`` would make bwrap
    nest a second user namespace (to mount devpts as root first), and commands could then not
    join the sandbox's other namespaces; so there ``/dev`` holds only bound character devices
    and the standard links.
    """
    if not user_namespace:
        return ["--dev", "/dev"]
    args: list[str] = []
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists(f"/dev/{name}"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        args += ["--symlink", target, f"/dev/{name}"]
    return [*args, "--tmpfs", "/dev/shm"]


def exec_argv(
    *,
    nsenter: str,
    setpriv: str,
    holder_pid: int,
    user_namespace: bool,
    network: bool,
    user: User | None,
    cwd: str,
    shell: str,
    command: str,
) -> list[str]:
    """Run ``command`` with ``shell -c`` in ``cwd`` inside the namespaces of ``holder_pid``.

    ``user`` is the user to switch to (only when this process is root); ``None`` keeps the
    caller's identity, which is the only one a user namespace maps. ``network`` says that the
    sandbox shares the host's network.
    """
    argv = [nsenter, "--target", str(holder_pid), "-m", "-u", "-i", "-p", "-r", "-w"]
    if not network:
        # With network the holder keeps the host's namespace, which a user namespace may
        # not join; nothing to join then.
        argv.append("-n")
    if user_namespace:
        argv += ["-U", "--preserve-credentials"]
    argv += ["--", setpriv]
    if user is not None:
        argv += [f"--reuid={user.uid}", f"--regid={user.gid}"]
        known = user.uid != 0 and user.name != str(user.uid)
        argv.append("--init-groups" if known else "--clear-groups")
    argv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    argv += ["--", "/bin/sh", "-c", _ENTER, "rllm-exec", cwd, shell, "-c", command]
    return argv


def probe(bwrap: str) -> str | None:
    """Return why bubblewrap cannot isolate a sandbox on this machine, or ``None`` when it can.

    Starts a throwaway sandbox with the namespaces and mounts real ones use.
    """
    program = shutil.which(bwrap)
    if program is None:
        return f"the bubblewrap program {bwrap!r} was not found on PATH"
    for helper in ("nsenter", "setpriv", "sleep"):
        if shutil.which(helper) is None:
            return f"{helper!r} (util-linux / coreutils) was not found on PATH"
    with tempfile.TemporaryDirectory(prefix="rllm-bwrap-probe-") as root:
        argv = [
            program,
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            *([] if os.geteuid() == 0 else ["--unshare-user"]),
            "--bind",
            root,
            "/",
            *Layout.of_host().args,
            "--proc",
            "/proc",
            *dev_args(os.geteuid() != 0),
            "--",
            "/bin/sh",
            "-c",
            "exit 0",
        ]
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{program} could not start a sandbox: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        return f"{program} cannot create namespaces here: {detail}"
    return None


def stop_holder(holder: subprocess.Popen[bytes], init_pid: int | None) -> None:
    """Kill a sandbox: its init first (the kernel then kills every process in the sandbox's
    PID namespace), then bwrap. ``init_pid`` is bwrap's reported child pid, when known."""
    if holder.poll() is not None:
        return
    if init_pid is not None:
        # While bwrap runs it has not reaped its child, so the pid still names that child.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(init_pid, signal.SIGKILL)
    try:
        holder.wait(timeout=5)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
