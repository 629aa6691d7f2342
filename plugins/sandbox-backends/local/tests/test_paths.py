"""Mapping sandbox paths to host paths, symlinks included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rllm_core.errors import SandboxError
from rllm_sandbox_backend_local.paths import PathMap


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "app" / "sub").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "f.txt").write_text("data")
    return root


def isolated(root: Path) -> PathMap:
    return PathMap(
        root=str(root),
        workdir="/app",
        isolated=True,
        readonly=("/usr", "/etc/passwd"),
        virtual=("/proc", "/dev"),
    )


def test_relative_and_dotted_paths_normalize_from_the_workdir(root: Path) -> None:
    paths = isolated(root)
    assert paths.absolute("x/../y.txt") == "/app/y.txt"
    assert paths.absolute("/tests/./t.sh") == "/tests/t.sh"
    assert paths.absolute("../../../etc") == "/etc"
    with pytest.raises(SandboxError, match="NUL"):
        paths.absolute("a\0b")


def test_isolated_paths_map_under_the_root_except_system_paths(root: Path) -> None:
    paths = isolated(root)
    assert paths.resolve("sub") == ("/app/sub", f"{root}/app/sub")
    assert paths.resolve("/tests/t.sh") == ("/tests/t.sh", f"{root}/tests/t.sh")
    assert paths.resolve("/usr/bin/env") == ("/usr/bin/env", "/usr/bin/env")
    assert paths.resolve("/etc/passwd") == ("/etc/passwd", "/etc/passwd")
    assert paths.resolve("/etc/hostname") == ("/etc/hostname", f"{root}/etc/hostname")
    assert paths.resolve("/usrlocal") == ("/usrlocal", f"{root}/usrlocal")
    with pytest.raises(SandboxError, match="read-only"):
        paths.resolve("/usr/x", write=True)
    with pytest.raises(SandboxError, match="kernel file system"):
        paths.resolve("/proc/1/status")


def test_symlinks_resolve_inside_the_sandbox(root: Path) -> None:
    paths = isolated(root)
    os.symlink("/data/f.txt", root / "app" / "abs")
    os.symlink("../data", root / "app" / "rel")
    os.symlink("/usr/bin", root / "app" / "tools")
    os.symlink("/proc/self", root / "app" / "me")
    assert paths.resolve("abs") == ("/data/f.txt", f"{root}/data/f.txt")
    assert paths.resolve("rel/f.txt") == ("/data/f.txt", f"{root}/data/f.txt")
    assert paths.resolve("tools/env") == ("/usr/bin/env", "/usr/bin/env")
    with pytest.raises(SandboxError, match="read-only"):
        paths.resolve("tools/new", write=True)
    with pytest.raises(SandboxError, match="kernel file system"):
        paths.resolve("me/environ")


def test_symlink_loops_are_reported(root: Path) -> None:
    os.symlink("/app/b", root / "app" / "a")
    os.symlink("/app/a", root / "app" / "b")
    with pytest.raises(SandboxError, match="link loop"):
        isolated(root).resolve("a")


def test_unisolated_paths_keep_the_workdir_and_move_the_rest(tmp_path: Path) -> None:
    workdir = str(tmp_path / "work")
    paths = PathMap(root="/private", workdir=workdir, isolated=False)
    assert paths.resolve("x.txt") == (f"{workdir}/x.txt", f"{workdir}/x.txt")
    assert paths.resolve(workdir) == (workdir, workdir)
    assert paths.resolve("/tests/t.sh") == ("/tests/t.sh", "/private/tests/t.sh")
    assert paths.resolve(f"{workdir}-sibling") == (
        f"{workdir}-sibling",
        f"/private{workdir}-sibling",
    )
