"""docs/scaling.md: every TOML snippet it shows, laid over the quickstart plan, passes plan check;
every key of the `parallel` table it describes exists, with the default it says."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from rllm_core.plugins import get_plugin_manager
from rllm_core.ports import ParallelSettings
from rllm_core.run.components import prepare_plan

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "scaling.md"
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"
SNIPPETS = re.findall(r"```toml\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)


def _toml(data: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(data)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet-{i}" for i in range(len(SNIPPETS))])
def test_each_snippet_checks_over_the_quickstart(snippet: str, tmp_path: Path) -> None:
    plan = tomllib.loads(QUICKSTART.read_text(encoding="utf-8"))
    plan["tasks"]["path"] = str((QUICKSTART.parent / plan["tasks"]["path"]).resolve())
    plan["tasks"]["eval_path"] = str((QUICKSTART.parent / plan["tasks"]["eval_path"]).resolve())
    for section, table in tomllib.loads(snippet).items():
        plan[section] = {**plan.get(section, {}), **table}
    path = tmp_path / "plan.toml"
    path.write_text(_toml(plan), encoding="utf-8")
    resolved = prepare_plan(path, (), run_dir=tmp_path / "run", manager=get_plugin_manager())
    assert resolved.get("[trainer]") is not None


def test_the_snippets_cover_parallel_and_both_vllm_sources() -> None:
    joined = "\n".join(SNIPPETS)
    assert "parallel = {" in joined
    assert "urls = [" in joined
    assert "serve = {" in joined


def test_the_parallel_table_lists_every_key_with_its_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `?\"?([\w.]+)\"?`? \|", PAGE.read_text(), re.MULTILINE)
    documented = dict(rows)
    defaults = ParallelSettings()
    assert set(documented) == set(ParallelSettings.model_fields)
    for key, value in documented.items():
        assert str(getattr(defaults, key)).removesuffix(".0") == value, key
