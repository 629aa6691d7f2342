"""Names from other frameworks (verl, TRL, rLLM, prime-rl) get a hint to the component here that
computes the same thing, or a note that none does; the table names only first-party components
and its documentation page is current."""

from __future__ import annotations

from pathlib import Path

import pytest
from rllm_core.errors import PlanError, UnknownComponentError
from rllm_core.plan.resolve import resolve_plan_file
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.aliases import (
    ALIASES,
    ALIASES_PAGE,
    alias_hint,
    aliases_for,
    aliases_markdown,
)
from rllm_core.plugins.catalog import FIRST_PARTY
from rllm_core.plugins.specs import canonical_name

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"


def unknown(manager: PluginManager, kind: str, name: str) -> UnknownComponentError:
    with pytest.raises(UnknownComponentError) as caught:
        manager.get(kind, name)
    return caught.value


def test_ppo_suggests_ppo_clip_with_its_verl_name_not_the_closest_spelling(
    installed_plugin_manager,
):
    error = unknown(installed_plugin_manager, "loss", "ppo")
    assert error.suggestion == "ppo-clip"
    assert "did you mean 'ppo-clip' (verl: vanilla; rLLM: ppo)?" in str(error)
    assert "dppo-tv'?" not in str(error)


def test_the_verl_name_itself_is_hinted_and_never_resolved(installed_plugin_manager):
    error = unknown(installed_plugin_manager, "loss", "vanilla")
    assert error.suggestion == "ppo-clip"
    assert "verl: vanilla" in str(error)


def test_a_verl_estimator_without_an_equivalent_says_so_and_names_the_nearest(
    installed_plugin_manager,
):
    error = unknown(installed_plugin_manager, "advantage_estimator", "reinforce_plus_plus")
    message = str(error)
    assert error.suggestion is None
    assert (
        "verl's reinforce_plus_plus advantage estimator has no rllm-core equivalent;"
        " the nearest is 'prpo'"
    ) in message
    assert "did you mean" not in message
    gae = str(unknown(installed_plugin_manager, "advantage_estimator", "gae"))
    assert "verl's gae advantage estimator has no rllm-core equivalent" in gae
    assert "value model" in gae


def test_a_verl_estimator_with_an_equivalent_points_to_it(installed_plugin_manager):
    error = unknown(installed_plugin_manager, "advantage_estimator", "rloo_vectorized")
    assert error.suggestion == "rloo"
    assert "did you mean 'rloo' (verl: rloo_vectorized)?" in str(error)


def test_trl_dr_grpo_names_the_loss_and_the_aggregation_that_make_it(installed_plugin_manager):
    error = unknown(installed_plugin_manager, "loss", "dr_grpo")
    assert error.suggestion == "ppo-clip"
    assert (
        "did you mean 'ppo-clip' with [algorithm].aggregation = \"seq-mean-token-sum-norm\""
        " (TRL: dr_grpo)?"
    ) in str(error)
    estimator = unknown(installed_plugin_manager, "advantage_estimator", "Dr-GRPO")
    assert estimator.suggestion == "grpo"
    assert "'grpo' with normalize_std = false" in str(estimator)


def test_trl_loss_types_that_differ_only_in_aggregation_are_listed_together(
    installed_plugin_manager,
):
    message = str(unknown(installed_plugin_manager, "loss", "dapo"))
    assert "'ppo-clip' with [algorithm].aggregation = \"token-mean\" (TRL: bnpo, dapo)" in message


def test_grpo_as_a_loss_also_says_it_is_an_advantage_estimator(installed_plugin_manager):
    message = str(unknown(installed_plugin_manager, "loss", "grpo"))
    assert "did you mean 'ppo-clip' with [algorithm].aggregation = \"seq-mean-token-mean\"" in (
        message
    )
    assert "'grpo' is an installed advantage estimator, not a loss" in message


def test_a_name_equal_after_normalising_gets_a_hint_to_that_name(installed_plugin_manager):
    for spelled in ("PPO.clip", "ppoclip", "ppo clip"):
        error = unknown(installed_plugin_manager, "loss", spelled)
        assert error.suggestion == "ppo-clip", spelled
        assert "did you mean 'ppo-clip'?" in str(error)
    # `+` counts: REINFORCE++ is not REINFORCE.
    plus = unknown(installed_plugin_manager, "advantage_estimator", "reinforce++")
    assert plus.suggestion is None
    assert "reinforce_plus_plus advantage estimator has no rllm-core equivalent" in str(plus)


def test_other_names_fall_back_to_the_closest_spelling(installed_plugin_manager):
    error = unknown(installed_plugin_manager, "loss", "dppo-tw")
    assert error.suggestion == "dppo-tv"
    assert "did you mean 'dppo-tv'?" in str(error)
    assert alias_hint("loss", "dppo-tw", ["dppo-tv"]) is None
    nothing = unknown(installed_plugin_manager, "loss", "qzxv-wibble")
    assert nothing.suggestion is None
    assert "did you mean" not in str(nothing)


def test_a_suggestion_that_is_not_installed_names_its_distribution():
    error = unknown(PluginManager(load_entry_points=False), "loss", "vanilla")
    assert error.suggestion == "ppo-clip"
    assert "from rllm-loss-ppo (pip install rllm-loss-ppo)" in str(error)


def test_plan_check_reports_the_hint_at_the_plan_key(installed_plugin_manager):
    with pytest.raises(PlanError) as caught:
        resolve_plan_file(
            QUICKSTART,
            ['algorithm.loss.name="vanilla"', 'algorithm.advantage.name="gae"'],
            manager=installed_plugin_manager,
        )
    issues = {issue.location: issue for issue in caught.value.issues}
    loss = issues["[algorithm].loss.name"]
    assert loss.path == str(QUICKSTART)
    assert loss.value == "vanilla"
    assert "did you mean 'ppo-clip' (verl: vanilla; rLLM: ppo)?" in loss.message
    advantage = issues["[algorithm].advantage.name"]
    assert "verl's gae advantage estimator has no rllm-core equivalent" in advantage.message


def test_every_component_the_table_names_is_first_party_and_installed(installed_plugin_manager):
    named = [
        (alias.kind, component)
        for alias in ALIASES
        for component in (alias.target, alias.nearest)
        if component is not None
    ]
    assert named
    not_first_party = [f"{k.value}:{n}" for k, n in named if n not in FIRST_PARTY.get(k, {})]
    assert not not_first_party, "the alias table names unknown components: " + ", ".join(
        not_first_party
    )
    missing = [
        f"{kind.value}:{name}"
        for kind, name in named
        if name not in installed_plugin_manager.names(kind)
    ]
    assert not missing, "the alias table names components not installed: " + ", ".join(missing)


def test_every_alias_is_one_of_a_kind_and_not_a_name_here_unless_it_adds_settings():
    seen = set()
    for alias in ALIASES:
        assert alias.kind in (Kind.LOSS, Kind.ADVANTAGE_ESTIMATOR)
        key = (alias.kind, alias.framework, canonical_name(alias.name))
        assert key not in seen, f"{key} is listed twice"
        seen.add(key)
        assert not (alias.target and alias.nearest), f"{alias.name}: a target needs no nearest"
        assert alias.target is not None or not (alias.options or alias.plan), alias.name
        assert aliases_for(alias.kind, alias.name)


def test_the_aliases_page_is_current():
    page = ROOT / ALIASES_PAGE
    assert page.read_text(encoding="utf-8") == aliases_markdown(), (
        "out of date: run `rllm-core docs write` from the repository root"
    )
