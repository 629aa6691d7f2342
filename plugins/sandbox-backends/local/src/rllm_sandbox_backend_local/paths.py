"""Where a path inside a sandbox lives on the host.

With bubblewrap, a sandbox sees its private root directory as ``/``, with the host's system
directories mounted read-only on top. The file API must see exactly what commands see, so a
sandbox path is resolved component by component: system paths map to the same host path,
everything else to the same path under the private root, and a symlink is followed *inside*
the sandbox (an absolute target restarts at the sandbox's ``/``), never on the host. A link a
command plants, such as ``/tests/x -> /etc/shadow``, therefore cannot reach a host file that
the sandbox does not see itself.

Without bubblewrap, commands see the host; the workdir is the real host directory, and every
other absolute path of the file API lives under the private root, where commands do not see it.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

from rllm_core.errors import SandboxError

__all__ = ["PathMap"]

_MAX_LINKS = 40


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


class PathMap:
    """Maps sandbox paths (absolute, or relative to ``workdir``) to host paths.

    ``root`` is the private root on the host. ``isolated`` says whether commands see it as
    ``/`` (bubblewrap). ``readonly`` lists sandbox paths that are host system paths, seen
    read-only at the same place; ``virtual`` lists kernel file systems (``/proc``, ``/dev``)
    that the file API does not reach.
    """

    def __init__(
        self,
        *,
        root: str,
        workdir: str,
        isolated: bool,
        readonly: Sequence[str] = (),
        virtual: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.workdir = posixpath.normpath(workdir)
        self.isolated = isolated
        self.readonly = tuple(posixpath.normpath(p) for p in readonly)
        self.virtual = tuple(posixpath.normpath(p) for p in virtual)

    def absolute(self, path: str) -> str:
        """The normalized absolute sandbox path; a relative path is taken from the workdir."""
        if "\0" in path:
            raise SandboxError(f"path {path!r} contains a NUL byte; remove it")
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def is_readonly(self, path: str) -> bool:
        return any(_within(path, p) for p in self.readonly)

    def _direct(self, spath: str) -> str:
        """The host path of one already-resolved sandbox path."""
        if not self.isolated:
            if _within(spath, self.workdir):
                return spath
            return self.root + spath
        if any(_within(spath, p) for p in self.virtual):
            raise SandboxError(
                f"{spath} is a kernel file system inside the sandbox and is not reachable"
                " through the file API; read it with exec (for example `cat`)"
            )
        if self.is_readonly(spath):
            return spath
        return self.root + spath if spath != "/" else self.root

    def resolve(self, path: str, *, write: bool = False) -> tuple[str, str]:
        """Return ``(sandbox path, host path)`` with every symlink followed inside the sandbox.

        ``write`` refuses a path that resolves into a read-only system directory.
        """
        spath = self.absolute(path)
        if not self.isolated:
            return spath, self._direct(spath)
        pending = _parts(spath)
        current = "/"
        hops = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                current = posixpath.dirname(current)
                continue
            candidate = posixpath.join(current, name)
            host = self._direct(candidate)
            if os.path.islink(host):
                hops += 1
                if hops > _MAX_LINKS:
                    raise SandboxError(
                        f"{spath}: more than {_MAX_LINKS} symbolic links; check for a link loop"
                    )
                target = os.readlink(host)
                if target.startswith("/"):
                    current = "/"
                pending[:0] = _parts(target)
                continue
            current = candidate
        host = self._direct(current)
        if write and self.is_readonly(current):
            raise SandboxError(
                f"{spath} is read-only in the sandbox: {current} is a host system directory;"
                " write under the workdir or another path outside the system directories"
            )
        return current, host
