"""Tests that need a system package skip with one wording, and the session ends with one line
counting them per package (rllm_core.testing.system and the kit's pytest plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rllm_core.testing.system import missing_package, summary_line

NEEDS_TOOL = """\
from rllm_core.testing.system import require_program


def test_one():
    require_program("rllm-no-such-program", "rllm-no-such-package", "run this test")


def test_two():
    require_program("rllm-no-such-program", "rllm-no-such-package", "run this test")


def test_plain_skip():
    import pytest

    pytest.skip("needs nothing from the system")
"""


def test_the_line_counts_the_skips_that_name_a_package_most_first() -> None:
    bwrap = missing_package("bubblewrap", "run Harbor tasks", "'bwrap' is not on PATH")
    chromium = missing_package("chromium", "screenshot the site", "'chromium' is not on PATH")
    assert bwrap == (
        "needs bubblewrap (apt-get install bubblewrap) to run Harbor tasks: 'bwrap' is not on PATH"
    )
    reasons = [chromium, f"Skipped: {bwrap}", bwrap, "rllm-sampler-vllm is needed"]
    assert summary_line(reasons) == (
        "skipped for missing system packages: 2 tests need bubblewrap (apt-get install"
        " bubblewrap), 1 test needs chromium (apt-get install chromium)"
    )
    assert summary_line(["rllm-sampler-vllm is needed"]) is None


def run_pytest(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_needs_tool.py").write_text(NEEDS_TOOL)
    environ = {key: value for key, value in os.environ.items() if key != "CI"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_needs_tool.py"],
        cwd=folder,
        env=dict(environ, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_session_ends_with_the_line_and_writes_it_where_asked(tmp_path: Path) -> None:
    target = tmp_path / "skips.txt"
    done = run_pytest(tmp_path, RLLM_SYSTEM_SKIPS_FILE=str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    line = (
        "skipped for missing system packages: 2 tests need rllm-no-such-package"
        " (apt-get install rllm-no-such-package)"
    )
    assert done.stdout.splitlines()[-2] == line
    assert target.read_text() == f"{line}\n"


def test_in_ci_a_missing_package_fails_the_test(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, CI="true")
    assert done.returncode == 1
    assert "2 failed, 1 skipped" in done.stdout
    assert "needs rllm-no-such-package (apt-get install rllm-no-such-package)" in done.stdout
