"""The docs cannot rot: generated pages are current, every hook and plan key is documented,
and code shown in guides is the code that ships."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from rllm_core.plan.schema import COMPONENT_SECTIONS
from rllm_core.reference import (
    HOOKS_PAGE,
    PLAN_PAGE,
    hook_functions,
    hook_signature,
    hooks_markdown,
    plan_keys,
    plan_reference_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
HOOK_TESTS = Path(__file__).with_name("test_hooks.py")
REGENERATE = "out of date: run `rllm-core docs write` from the repository root"


def test_hooks_page_is_current():
    assert (ROOT / HOOKS_PAGE).read_text(encoding="utf-8") == hooks_markdown(), REGENERATE


@pytest.mark.parametrize("hook", hook_functions(), ids=lambda fn: fn.__name__)
def test_hook_documented_with_exact_signature(hook):
    page = (ROOT / HOOKS_PAGE).read_text(encoding="utf-8")
    assert f"## `{hook_signature(hook)}`" in page
    assert hook.__doc__ and "Example::" in hook.__doc__, f"{hook.__name__} needs an example"


def test_hook_signature_is_fully_annotated():
    for hook in hook_functions():
        annotations = hook.__annotations__
        assert "return" in annotations, hook.__name__
        for name in hook.__code__.co_varnames[: hook.__code__.co_argcount]:
            assert name in annotations, f"{hook.__name__}({name}) is not annotated"


def test_every_hook_has_a_test_named_after_it():
    tree = ast.parse(HOOK_TESTS.read_text(encoding="utf-8"))
    tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [fn.__name__ for fn in hook_functions() if f"test_{fn.__name__}" not in tests]
    assert not missing, f"add tests to {HOOK_TESTS.name}: " + ", ".join(missing)


def test_plan_reference_is_current(installed_plugin_manager):
    current = (ROOT / PLAN_PAGE).read_text(encoding="utf-8")
    assert current == plan_reference_markdown(installed_plugin_manager), REGENERATE


def test_every_plan_key_is_on_the_reference_page(installed_plugin_manager):
    page = (ROOT / PLAN_PAGE).read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    for chunk in re.split(r"^#{2,3} ", page, flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        sections[title.strip().strip("`")] = body
    missing = []
    for key in plan_keys(installed_plugin_manager):
        if key.startswith("["):
            section, _, name = key.partition("].")
            section += "]"
            body = sections.get(section, "")
            if name == "name" and section.strip("[]") in {*COMPONENT_SECTIONS, "loggers"}:
                body = sections.get("Component sections", "")
                if f"`{section}`" not in body and f"`[{section}]`" not in body:
                    missing.append(key)
                continue
        else:
            section, _, name = key.rpartition(".")
            body = sections.get(section, "")
        if f"| `{name}` |" not in body:
            missing.append(key)
    assert not missing, "keys missing from the plan reference: " + ", ".join(missing)


FILE_BLOCK = re.compile(r"<!-- file: (?P<path>[^ ]+) -->\s*\n```[a-z]*\n(?P<body>.*?)\n```", re.S)


def test_guide_code_blocks_match_shipped_files():
    guides = sorted((ROOT / "docs").rglob("*.md"))
    checked = 0
    for guide in guides:
        for match in FILE_BLOCK.finditer(guide.read_text(encoding="utf-8")):
            shipped = (ROOT / match["path"]).read_text(encoding="utf-8").rstrip("\n")
            assert match["body"].rstrip("\n") == shipped, (
                f"{guide.name} shows a stale {match['path']}"
            )
            checked += 1
    assert checked >= 3, "the authoring guide should show the example plugin's files"
