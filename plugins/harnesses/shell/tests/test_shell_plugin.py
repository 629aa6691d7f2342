"""The entry module: what it registers, what it imports, and the checks on plan keys."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_harness_shell import plugin
from rllm_harness_shell.harness import ShellHarness
from rllm_harness_shell.plugin import DEFAULT_SYSTEM_PROMPT, ShellConfig


def test_entry_module_imports_neither_the_harness_nor_openai():
    code = (
        "import sys, rllm_harness_shell.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('openai', 'httpx', 'rllm_harness_shell', 'rllm_harness_single_turn')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_harness_shell', 'rllm_harness_shell.plugin']"


def test_installed_entry_point_provides_the_harness():
    pm = PluginManager(disabled=())
    [record] = [r for r in pm.plugins() if r.distribution == "rllm-harness-shell"]
    assert list(record.components) == ["harness:shell"]


def test_builds_from_plan_keys():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="shell", distribution="rllm-harness-shell")
    harness = pm.get("harness", "shell").build({"max_turns": 8, "system_prompt": None})
    assert isinstance(harness, ShellHarness)
    assert (harness.config.max_turns, harness.config.system_prompt) == (8, None)


def test_the_default_prompts_use_only_their_placeholders():
    config = ShellConfig()
    assert config.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert "{done_marker}" in DEFAULT_SYSTEM_PROMPT


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"system_prompt": "Use {tools}"}, "system_prompt uses the placeholder {tools}"),
        ({"observation_template": "{stdout}"}, "observation_template uses the placeholder"),
        ({"format_reminder": "say {instruction}"}, "format_reminder uses the placeholder"),
        ({"truncation_marker": "[{cut"}, "truncation_marker is not a valid template"),
        ({"done_marker": "ALL\nDONE"}, "done_marker 'ALL\\\\nDONE' must be one line"),
        ({"done_marker": " DONE"}, "must be one line without surrounding spaces"),
        ({"done_marker": ""}, "at least 1 character"),
        ({"max_turns": 0}, "greater than 0"),
        ({"max_output_chars": 0}, "greater than 0"),
        ({"max_turn": 5}, "Extra inputs are not permitted"),
    ],
)
def test_bad_plan_keys_are_refused_with_the_key_named(keys, message):
    with pytest.raises(pydantic.ValidationError, match=message.replace("{", r"\{")):
        ShellConfig(**keys)
