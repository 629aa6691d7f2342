"""The docs cannot rot: generated pages are current, every hook and plan key is documented,
every port module and plugin README has a page in the site, and code shown in guides is the code
that ships."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rllm_core.cli.docs_cmd import docs
from rllm_core.docs_site import DOCS_SITE, docs_page
from rllm_core.plan.schema import COMPONENT_SECTIONS
from rllm_core.reference import (
    API_DIR,
    HOOKS_PAGE,
    MKDOCS_CONFIG,
    NAV_BEGIN,
    NAV_END,
    PLAN_PAGE,
    PLUGINS_DIR,
    DocsSourceError,
    api_pages,
    hook_functions,
    hook_signature,
    hooks_markdown,
    mkdocs_config,
    plan_keys,
    plan_reference_markdown,
    plugin_pages,
    stale_pages,
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


# ------------------------------------------------------------------------------- the site


def test_api_and_plugin_pages_and_nav_are_current():
    generated = {**api_pages(), **plugin_pages(ROOT)}
    stale = [
        str(path)
        for path, text in generated.items()
        if not (ROOT / path).is_file() or (ROOT / path).read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{', '.join(stale)} {REGENERATE}"
    assert not stale_pages(ROOT, generated), f"no longer generated: {REGENERATE}"
    config = (ROOT / MKDOCS_CONFIG).read_text(encoding="utf-8")
    assert config == mkdocs_config(ROOT, list(generated)), f"mkdocs.yml nav {REGENERATE}"


def _nav() -> str:
    return (ROOT / MKDOCS_CONFIG).read_text(encoding="utf-8")


def test_every_port_module_has_an_api_page_in_the_nav():
    modules = sorted((ROOT / "core/src/rllm_core/ports").glob("[!_]*.py"))
    assert len(modules) >= 8
    for module in [*modules, ROOT / "core/src/rllm_core/plugins/hookspecs.py"]:
        dotted = ".".join(module.relative_to(ROOT / "core/src").with_suffix("").parts)
        page = API_DIR / f"{module.stem}.md"
        assert f"\n::: {dotted}\n" in (ROOT / page).read_text(encoding="utf-8"), page
        assert f"- {page.relative_to('docs').as_posix()}\n" in _nav(), f"{page} not in the nav"


def test_every_plugin_readme_has_a_page_in_the_nav():
    readmes = sorted(ROOT.glob("plugins/*/*/README.md"))
    assert len(readmes) >= 20
    for readme in readmes:
        kind, name = readme.parent.parent.name, readme.parent.name
        page = PLUGINS_DIR / f"{kind}-{name}.md"
        body = (ROOT / page).read_text(encoding="utf-8").partition("\n\n")[2]
        title = readme.read_text(encoding="utf-8").partition("\n")[0]
        assert body.startswith(title + "\n"), page
        assert f"- {page.relative_to('docs').as_posix()}\n" in _nav(), f"{page} not in the nav"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return root


README = """# rllm-loss-demo

Demo losses for [rllm-core](../../../core), next to
[the grpo estimator](../../advantage-estimators/grpo/README.md#keys) and
[docs/tasks.md](../../../docs/tasks.md); the code is [loss.py](src/demo/loss.py),
[`src/demo/loss.py`](src/demo/loss.py) and [upstream](https://example.org/x.md).

```markdown
[kept as written](../../../core)
```
"""


def test_plugin_readme_links_resolve_in_the_site(tmp_path):
    root = _tree(
        tmp_path,
        {
            "plugins/losses/demo/README.md": README,
            "plugins/losses/demo/src/demo/loss.py": "",
            "plugins/advantage-estimators/grpo/README.md": "# rllm-advantage-estimator-grpo\n",
            "docs/tasks.md": "# Harbor tasks\n",
        },
    )
    page = plugin_pages(root)[PLUGINS_DIR / "losses-demo.md"]
    assert "from plugins/losses/demo/README.md; edit that file" in page.partition("\n")[0]
    assert "[rllm-core](../../index.md)" in page
    assert "[the grpo estimator](advantage-estimators-grpo.md#keys)" in page
    assert "[Harbor tasks](../../tasks.md)" in page
    assert "loss.py (`plugins/losses/demo/src/demo/loss.py`)" in page
    assert "\n`plugins/losses/demo/src/demo/loss.py` and" in page
    assert "[upstream](https://example.org/x.md)" in page
    assert "[kept as written](../../../core)" in page
    index = plugin_pages(root)[PLUGINS_DIR / "index.md"]
    assert "| [`rllm-loss-demo`](losses-demo.md) | `plugins/losses/demo` | Demo losses" in index


def test_a_broken_readme_link_names_the_readme_and_the_link(tmp_path):
    _tree(
        tmp_path,
        {"plugins/losses/demo/README.md": "# demo\n\nSee [gone](../../../docs/gone.md).\n"},
    )
    with pytest.raises(DocsSourceError, match=r"plugins/losses/demo/README.md: the link \[gone\]"):
        plugin_pages(tmp_path)


def test_docs_write_regenerates_the_nav_and_removes_stale_pages(tmp_path):
    config = f"nav:\n  - Reference:\n      {NAV_BEGIN}\n      - old.md\n      {NAV_END}\n"
    root = _tree(
        tmp_path,
        {
            "mkdocs.yml": config,
            "plugins/losses/demo/README.md": "# rllm-loss-demo\n\nDemo losses.\n",
            "docs/reference/plugins/losses-gone.md": "# gone\n",
        },
    )
    checked = CliRunner().invoke(docs, ["write", "--check", "--root", str(root)])
    assert checked.exit_code == 1, checked.output
    assert "docs/reference/plugins/losses-gone.md" in checked.output
    written = CliRunner().invoke(docs, ["write", "--root", str(root)])
    assert written.exit_code == 0, written.output
    assert not (root / "docs/reference/plugins/losses-gone.md").exists()
    assert "      - reference/plugins/losses-demo.md\n" in (root / "mkdocs.yml").read_text()
    assert "old.md" not in (root / "mkdocs.yml").read_text()
    again = CliRunner().invoke(docs, ["write", "--check", "--root", str(root)])
    assert again.exit_code == 0, again.output


def test_docs_write_outside_the_repository_says_where_to_run_it(tmp_path):
    result = CliRunner().invoke(docs, ["write", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path.resolve()} has no mkdocs.yml" in result.output


def test_docs_page_names_known_pages_only():
    assert docs_page("running", "reproducibility") == f"{DOCS_SITE}/running/#reproducibility"
    with pytest.raises(ValueError, match=r"'docs/running\.md' is not a page"):
        docs_page("docs/running.md")
