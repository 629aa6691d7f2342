"""A plugin installed from outside the repository shows up, is usable from a plan, and leaves
cleanly when uninstalled: the round trip a third-party author makes with
``examples/third-party-loss`` (distribution ``rllm-loss-example``, ``loss:reinforce-tis``).

The test uninstalls the example from the environment running it and reinstalls it editable
afterwards, whatever happens in between.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "third-party-loss"
DISTRIBUTION = "rllm-loss-example"
COMPONENT = "loss:reinforce-tis"
PLAN = '[algorithm]\nloss = "reinforce-tis"\n'

pytestmark = pytest.mark.install


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _require(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, (
        f"`{' '.join(done.args)}` exited {done.returncode}\n{done.stdout}{done.stderr}"
    )


def _entries(run_cli) -> list[dict]:
    result = run_cli("plugins", "--json")
    assert result.returncode == 0, str(result)
    return [e for e in result.json() if _normalize(e["distribution"]) == DISTRIBUTION]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_example_plugin_install_round_trip(run_cli, tmp_path):
    assert (EXAMPLE_DIR / "pyproject.toml").is_file(), (
        f"{EXAMPLE_DIR} is missing: the third-party example package belongs to the repository"
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN, encoding="utf-8")

    entries = _entries(run_cli)
    assert len(entries) == 1, (
        f"expected one {DISTRIBUTION} entry in `rllm-core plugins --json`, got {entries};"
        " run scripts/setup.sh to install the example"
    )
    assert entries[0]["status"] == "active", entries[0]
    assert COMPONENT in entries[0]["provides"], entries[0]

    checked = run_cli("plan", "check", str(plan))
    assert checked.returncode == 0, f"a plan selecting {COMPONENT} should be valid:\n{checked}"

    try:
        _require(_pip("uninstall", "-y", DISTRIBUTION))

        assert _entries(run_cli) == []

        checked = run_cli("plan", "check", str(plan))
        assert checked.returncode == 2, (
            f"with {DISTRIBUTION} uninstalled the plan check must exit 2:\n{checked}"
        )
        assert "reinforce-tis" in checked.output, (
            f"the plan error must name the missing loss:\n{checked}"
        )
    finally:
        _require(
            _pip("install", "--quiet", "--no-build-isolation", "--no-deps", "-e", str(EXAMPLE_DIR))
        )

    restored = _entries(run_cli)
    assert [(e["status"], COMPONENT in e["provides"]) for e in restored] == [("active", True)]
