"""The README's plugin table names exactly the first-party plugins and what they provide."""

from __future__ import annotations

import re


def test_readme_lists_every_first_party_plugin(repo_root, first_party_plugins, run_cli):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| `(rllm-[a-z0-9-]+)` \| (.+) \|$", readme, flags=re.M))
    assert set(table) == {p.distribution for p in first_party_plugins}
    listed = {row["distribution"]: row["provides"] for row in run_cli("plugins", "--json").json()}
    for distribution, cell in table.items():
        for component in listed[distribution]:
            name = component.partition(":")[2]
            assert f"`{name}`" in cell, f"README: {distribution} should mention {name}"
