"""Finding and killing a bubblewrap sandbox's processes from the host.

A sandbox's processes are the host processes in its PID namespace, read from the host's
``/proc``, which nothing in the sandbox can change. A process is named by its pid and its
start time, so a pid reused after the mark is not mistaken for a spared process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = ["Process", "holder_processes", "kill_all_but", "namespace_of", "processes_in"]

Process = tuple[int, int]
"""A host pid and its start time (clock ticks since boot)."""


def namespace_of(pid: int) -> str:
    """The PID namespace ``pid`` is in, as ``/proc`` names it (``pid:[4026532...]``)."""
    return os.readlink(f"/proc/{pid}/ns/pid")


def _started(pid: int) -> int | None:
    """The start time of a running ``pid``; ``None`` once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def processes_in(namespace: str) -> set[Process]:
    """Every live process of the host in the PID namespace ``namespace``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if namespace_of(pid) != namespace:
                continue
        except OSError:
            continue
        started = _started(pid)
        if started is not None:
            found.add((pid, started))
    return found


def _inner_pid(pid: int) -> int | None:
    """``pid``'s number in its own PID namespace (the last of ``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def holder_processes(namespace: str) -> set[Process]:
    """The sandbox's own two processes: bubblewrap's init (pid 1 of the namespace) and the
    ``sleep`` it started first (pid 2), which keep the namespaces alive."""
    return {p for p in processes_in(namespace) if _inner_pid(p[0]) in (1, 2)}


def kill_all_but(namespace: str, spared: set[Process], within_s: float) -> tuple[int, set[Process]]:
    """SIGKILL every process in ``namespace`` but ``spared``, again and again, until none is
    left or ``within_s`` seconds pass (a process may fork while the previous round runs).

    Returns how many were killed and those still running at the end (empty on success).
    """
    killed: set[Process] = set()
    deadline = time.monotonic() + within_s
    while True:
        left = processes_in(namespace) - spared
        if not left or time.monotonic() > deadline:
            return len(killed - left), left
        for pid, started in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add((pid, started))
        time.sleep(0.01)
