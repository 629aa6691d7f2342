"""Copying a local directory into a sandbox, byte for byte, keeping executable bits."""

from __future__ import annotations

import asyncio
import os
import posixpath
import shlex
from pathlib import Path

from rllm_core.errors import SandboxError
from rllm_core.ports.sandboxes import Sandbox

__all__ = ["upload_dir"]

_CHMOD_TIMEOUT_S = 60.0


def _collect(source: Path) -> list[tuple[str, Path, bool]]:
    files = []
    for root, dirs, names in os.walk(source):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file():
                relative = path.relative_to(source).as_posix()
                files.append((relative, path, os.access(path, os.X_OK)))
    return files


async def upload_dir(sandbox: Sandbox, source: Path, dest: str) -> list[str]:
    """Write every file under ``source`` to ``dest`` in the sandbox and return the sandbox
    paths written, in order.

    Files a host user may execute are made executable in the sandbox with one ``chmod`` (the
    file API carries bytes, not modes). Raises ``SandboxError`` when that ``chmod`` fails.
    """
    files = await asyncio.to_thread(_collect, source)
    written = []
    executables = []
    for relative, path, executable in files:
        target = posixpath.join(dest, relative)
        await sandbox.write_file(target, await asyncio.to_thread(path.read_bytes))
        written.append(target)
        if executable:
            executables.append(target)
    if executables:
        command = "chmod +x " + " ".join(shlex.quote(path) for path in executables)
        result = await sandbox.exec(command, timeout=_CHMOD_TIMEOUT_S)
        if result.exit_code != 0:
            raise SandboxError(
                f"could not mark {len(executables)} uploaded file(s) under {dest} executable"
                f" (exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}"
            )
    return written
