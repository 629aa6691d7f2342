"""Fixtures: a backend in each isolation mode, a scan of the host's processes, and a real
gateway (``gateway``) for the gateway network."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig


def _host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture
def host_processes_with() -> Callable[[str], list[int]]:
    return _host_processes_with


@pytest.fixture
def bwrap_backend(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(LocalSandboxConfig(isolation="bwrap", root_dir=tmp_path / "roots"))
    yield backend
    run_with_deadline(backend.close(), 30)


@pytest.fixture
def plain_backend(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(LocalSandboxConfig(isolation="none", root_dir=tmp_path / "roots"))
    yield backend
    run_with_deadline(backend.close(), 30)
