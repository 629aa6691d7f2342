"""Headless Chromium for tests that load a page in a real browser: the program (skipped
without it, failed in CI) and one run of it with the flags that keep it quiet, offline and
away from the user's profile."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rllm_core.testing.system import require_program

__all__ = ["headless"]


def headless(
    url: str, profile: Path, *args: str, why: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on ``url`` with ``args`` (``--screenshot=...``, ``--dump-dom``)
    and a profile folder of its own; ``why`` says what the test needs it for."""
    chromium = require_program("chromium", "chromium", why)
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
