"""An object store in a folder: one file per key under ``root/objects``.

The ``object_store:file`` plugin and a run's own checkpoints (:mod:`rllm_core.run.checkpoints`)
both store objects this way.

A put writes the bytes to a new file under ``root/tmp``, fsyncs it, then moves it into place
and fsyncs the directory. ``put`` moves it with ``os.replace`` (an overwrite); ``put_if_absent``
with ``os.link``, which fails when the name exists, so of two writers racing for one key
exactly one creates it, and a key once created is never renamed over. Readers therefore see
the old or the new bytes, never a mix, and an acknowledged put survives a crash. Both
directories must be on one filesystem, which they are unless ``tmp`` is a mount point.

Keys map to paths directly (``runs/r1/cuts/000010.json`` is ``root/objects/runs/r1/cuts/
000010.json``), so a key cannot also be a folder of other keys: with ``a/b`` stored, putting
``a`` fails, and the other way round. Deleting the last key of a folder removes the folder.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

from rllm_core.errors import ObjectNotFoundError, StorageError
from rllm_core.storage.durable import fsync_directory, make_directories, write_all
from rllm_core.storage.keys import check_key, is_key

__all__ = ["FolderObjectStore"]

_ATTEMPTS = 5


class FolderObjectStore:
    """An :class:`~rllm_core.ports.ObjectStore` in the directory ``root``. Thread-safe, and
    safe for several processes sharing ``root`` on one machine."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._objects = make_directories(self.root, ["objects"], durable=True)
        self._tmp = make_directories(self.root, ["tmp"], durable=True)

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and durably, replacing any object there."""
        self._place(key, data, create_only=False)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless an object is there; ``True`` when this call
        created it."""
        return self._place(key, data, create_only=True)

    def get(self, key: str) -> bytes:
        path = self._objects.joinpath(*check_key(key))
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(
                f"no object is stored under {key!r} in {self._objects}"
            ) from None

    def exists(self, key: str) -> bool:
        return self._objects.joinpath(*check_key(key)).is_file()

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is a no-op. Empty folders left behind are removed."""
        path = self._objects.joinpath(*check_key(key))
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except PermissionError as exc:
            if exc.errno == errno.EISDIR or path.is_dir():
                return
            raise
        fsync_directory(path.parent)
        folder = path.parent
        while folder != self._objects:
            try:
                os.rmdir(folder)
            except OSError:
                break
            folder = folder.parent

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Every key that starts with ``prefix`` (plain string prefix) and sorts after
        ``start_after``, sorted."""
        head, slash, _ = prefix.rpartition("/")
        start, base = self._objects, ""
        if slash and is_key(head):
            start, base = self._objects.joinpath(*head.split("/")), head + "/"
        keys: list[str] = []
        stack = [(start, base)]
        while stack:
            folder, relative = stack.pop()
            try:
                with os.scandir(folder) as scan:
                    entries = list(scan)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                key = relative + entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), key + "/"))
                elif (
                    entry.is_file(follow_symlinks=False)
                    and key.startswith(prefix)
                    and (start_after is None or key > start_after)
                ):
                    keys.append(key)
        keys.sort()
        return keys

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # ---------------------------------------------------------------- helpers

    def _place(self, key: str, data: bytes, *, create_only: bool) -> bool:
        parts = check_key(key)
        temporary = self._write_temporary(data)
        try:
            for attempt in range(_ATTEMPTS):
                folder = self._make_folder(key, parts[:-1])
                target = folder / parts[-1]
                try:
                    if create_only:
                        os.link(temporary, target)
                    else:
                        os.replace(temporary, target)
                except FileExistsError:
                    if target.is_dir():
                        raise self._clash(key, f"keys below {key + '/'!r} exist") from None
                    return False
                except (FileNotFoundError, NotADirectoryError):
                    # A concurrent delete removed the folder after we made it (and perhaps a
                    # put stored an object in its place): look again.
                    if attempt == _ATTEMPTS - 1:
                        raise
                    continue
                except IsADirectoryError:
                    raise self._clash(key, f"keys below {key + '/'!r} exist") from None
                fsync_directory(folder)
                return True
            raise AssertionError("unreachable")
        finally:
            temporary.unlink(missing_ok=True)

    def _write_temporary(self, data: bytes) -> Path:
        temporary = self._tmp / f"put-{uuid.uuid4().hex}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise
        os.close(fd)
        return temporary

    def _make_folder(self, key: str, parts: tuple[str, ...]) -> Path:
        try:
            return make_directories(self._objects, parts, durable=True)
        except (NotADirectoryError, FileExistsError):
            for depth in range(1, len(parts) + 1):
                if self._objects.joinpath(*parts[:depth]).is_file():
                    clash = "/".join(parts[:depth])
                    raise self._clash(key, f"{clash!r} is an object") from None
            raise

    def _clash(self, key: str, reason: str) -> StorageError:
        return StorageError(
            f"cannot store {key!r} in {self._objects}: {reason}, and a file store cannot hold"
            " a key and keys below it at once; choose another key"
        )
