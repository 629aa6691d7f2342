"""The kit's checks of an installed plugin package (:mod:`rllm_core.testing.packages`)."""

from __future__ import annotations

from rllm_core.testing.packages import installed_component_keys, modules_imported_by


def test_modules_imported_by_lists_only_the_given_packages_in_a_fresh_interpreter():
    loaded = modules_imported_by("json", ("json", "email"))
    assert "json" in loaded and "json.decoder" in loaded
    assert loaded == sorted(loaded)
    assert not [name for name in loaded if name.split(".")[0] == "email"]


def test_installed_component_keys_of_a_distribution_that_is_not_installed_are_empty():
    assert installed_component_keys("surely-not-an-installed-distribution") == set()
