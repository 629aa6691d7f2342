"""Filesystem steps that make a write survive a crash: full writes, fsync of files and of the
directories that name them, and atomic replacement of small files."""

from __future__ import annotations

import errno
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: locking is then advisory only by convention
    fcntl = None  # type: ignore[assignment]

from rllm_core.errors import StorageError

__all__ = [
    "acquire_directory_lock",
    "append_durably",
    "fsync_directory",
    "make_directories",
    "replace_file",
    "sync_file",
    "write_all",
]

LOCK_NAME = "lock"

log = logging.getLogger(__name__)


def acquire_directory_lock(path: Path, what: str) -> int:
    """Take an exclusive, non-blocking lock on ``path/lock`` and return its descriptor (close it
    to release). A second opener gets a :class:`StorageError` naming ``what`` and ``path``."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(
            f"the {what} at {path} is already open in another process or instance; close that"
            " one first, or give this one another path"
        ) from None
    return fd


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def append_durably(
    fd: int, data: bytes, *, end: int, fsync: bool, what: str, on_lost_tail: Callable[[], None]
) -> None:
    """Append ``data`` to the file whose end is at ``end`` and, with ``fsync``, to stable storage.

    On an ``OSError`` the file is cut back to ``end``, so that the next append does not follow a
    torn write, and a :class:`StorageError` saying ``what`` failed is raised; when even the cut
    fails, ``on_lost_tail()`` is called (close the file: opening it again cuts the tail).
    """
    try:
        write_all(fd, data)
        if fsync:
            sync_file(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, end)
        except OSError:
            log.exception("could not cut a failed append: %s", what)
            on_lost_tail()
        raise StorageError(
            f"{what} failed: {exc}; nothing was stored, free disk space or fix the directory and"
            " retry"
        ) from exc


def sync_file(fd: int) -> None:
    """Flush a file's data and the metadata needed to read it back to stable storage."""
    getattr(os, "fdatasync", os.fsync)(fd)


def fsync_directory(path: Path) -> None:
    """Persist the entries of directory ``path`` (a new, renamed or removed name in it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directories(base: Path, parts: tuple[str, ...] | list[str], *, durable: bool) -> Path:
    """Create ``base/parts[0]/parts[1]/...`` one level at a time and return it.

    ``base`` must exist. Each directory created here is made durable in its parent when
    ``durable`` is true, so that a file later placed inside cannot vanish with a crash. Raises
    ``NotADirectoryError`` when a level exists as something other than a directory.
    """
    current = base
    for part in parts:
        child = current / part
        try:
            os.mkdir(child)
        except FileExistsError:
            if not child.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, "exists and is not a directory", str(child)
                ) from None
        else:
            if durable:
                fsync_directory(current)
        current = child
    return current


def replace_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Replace ``path`` with ``data`` so that a reader, or a restart after a crash, sees either
    the old or the new content in full: write a temporary file beside it, fsync it, rename it
    over ``path``, then fsync the directory."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)
