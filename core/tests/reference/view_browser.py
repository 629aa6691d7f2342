"""Driving ``rllm-core view`` from tests: its first output line, and a page loaded in headless
Chromium whose DOM is returned once the page says it finished rendering, with a screenshot
saved; a console message or an error the page caught fails the test."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image, ImageStat
from reference.chromium import headless

__all__ = ["first_line", "serving", "visit"]


def first_line(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            process.kill()
            pytest.fail(f"rllm-core view printed nothing in {timeout:.0f}s")
    return process.stdout.readline()


def chromium_run(args: list[str], url: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return headless(
        url,
        profile,
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=4000",
        *args,
        why="drive the rllm-core view page",
    )


def console(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def visit(url: str, tmp_path: Path, png: str, height: int) -> str:
    """The page's DOM once its data is shown; its screenshot saved as ``png``. Fails on a
    console message or an error the page caught."""
    shot = tmp_path / png
    done = chromium_run(
        ["--dump-dom", f"--screenshot={shot}", f"--window-size=1280,{height}"],
        url,
        tmp_path / "profile",
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr
    assert not console(done), console(done)
    html = done.stdout
    assert "data-ready=" in html, f"{url}: the page never finished rendering\n{html[:2000]}"
    assert "data-errors" not in html, re.search(r'data-errors="[^"]*"', html)[0]
    with Image.open(shot) as image:
        grey = image.convert("L")
    assert ImageStat.Stat(grey).stddev[0] > 10, f"{png}: almost uniform"
    keep = os.environ.get("RLLM_VIEW_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(keep) / png)
    return html


@contextmanager
def serving(path: Path) -> Iterator[str]:
    """``rllm-core view PATH --port 0`` running; yields its base URL, stops it after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rllm_core", "view", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )
    try:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", first_line(process))
        assert found, "rllm-core view printed no URL"
        yield found[1]
    finally:
        process.terminate()
        process.wait(timeout=10)
