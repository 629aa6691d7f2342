"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

from rllm_core.plugins import PluginManager
from rllm_harness_cli import plugin
from rllm_harness_cli.harness import CliHarness


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_harness_cli.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rllm_harness_cli'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_harness_cli', 'rllm_harness_cli.plugin']"


def test_installed_entry_point_provides_the_harness():
    pm = PluginManager(disabled=())
    [record] = [r for r in pm.plugins() if r.distribution == "rllm-harness-cli"]
    assert list(record.components) == ["harness:cli"]


def test_builds_from_plan_keys():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="cli", distribution="rllm-harness-cli")
    harness = pm.get("harness", "cli").build(
        {"invocation": "agent {instruction_path}", "env": {"A": "{model}"}, "timeout_cap_s": 60}
    )
    assert isinstance(harness, CliHarness)
    assert harness.config.env == {"A": "{model}"}
    assert harness.config.timeout_cap_s == 60
