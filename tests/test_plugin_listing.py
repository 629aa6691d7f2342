"""Every first-party plugin shows up in ``rllm-core plugins`` as it should, the core's catalog
of who provides what agrees with what the plugins really provide, and every component's config
describes each of its keys (the plan reference is generated from those descriptions)."""

from __future__ import annotations

from rllm_core.plugins import PluginManager
from rllm_core.plugins.catalog import FIRST_PARTY

_LISTED: dict[str, dict] = {}


def listing(run_cli) -> dict[str, dict]:
    """`rllm-core plugins --json`, run once for the module's tests: what it lists does not
    change between them."""
    if not _LISTED:
        result = run_cli("plugins", "--json")
        assert result.returncode == 0, result
        _LISTED.update({row["distribution"]: row for row in result.json()})
    return _LISTED


def test_plugin_is_listed_active(plugin_package, run_cli):
    rows = listing(run_cli)
    assert plugin_package.distribution in rows, (
        f"{plugin_package.distribution} is not in `rllm-core plugins`; is it installed?"
    )
    row = rows[plugin_package.distribution]
    assert row["status"] == "active", row
    assert row["provides"], f"{plugin_package.distribution} provides no component"
    assert row["version"] and row["version"] != "unknown"


def test_catalog_matches_what_plugins_provide(plugin_package, run_cli):
    provided = set(listing(run_cli)[plugin_package.distribution]["provides"])
    catalogued = {
        f"{kind.value}:{name}"
        for kind, names in FIRST_PARTY.items()
        for name, dist in names.items()
        if dist == plugin_package.distribution
    }
    assert provided == catalogued, (
        f"rllm_core.plugins.catalog lists {sorted(catalogued)} for"
        f" {plugin_package.distribution}, which provides {sorted(provided)}"
    )


def test_table_lists_every_plugin(first_party_plugins, run_cli):
    result = run_cli("plugins")
    assert result.returncode == 0, result
    for package in first_party_plugins:
        assert package.distribution in result.stdout


def test_every_config_forbids_unknown_keys_and_describes_each_key(first_party_plugins):
    ours = {p.distribution for p in first_party_plugins}
    manager = PluginManager(disabled=())
    problems = []
    for record in manager.plugins():
        if record.distribution not in ours:
            continue
        for key in record.components:
            kind, _, name = key.partition(":")
            config = manager.get_record(kind, name).spec.config
            if config.model_config.get("extra") != "forbid":
                problems.append(f"{key} ({record.distribution}): config accepts unknown keys")
            for field, info in config.model_fields.items():
                if not info.description:
                    problems.append(f"{key} ({record.distribution}): key {field!r} undescribed")
    assert problems == []
