"""The keys a run writes into a component's config are the ones its spec declares
(``run_keys``, :mod:`rllm_core.plugins.run_keys`): a spec cannot declare a key its config
lacks or one the table does not have, and every first-party component whose config has a
field of its kind's run keys declares it, so none is left unfilled by mistake."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from rllm_core.plugins import ComponentSpec, PluginManager
from rllm_core.plugins.catalog import FIRST_PARTY
from rllm_core.plugins.run_keys import RUN_KEYS


class _WithPath(BaseModel):
    path: str = "here"


class _Bare(BaseModel):
    pass


def _spec(config: type[BaseModel], **traits: object) -> ComponentSpec:
    return ComponentSpec(
        kind="trace_store",
        name="probe",
        factory=lambda config: None,
        config=config,
        summary="probe",
        traits=traits,
    )


def test_a_run_key_the_config_lacks_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"trace_store:probe: trait 'run_keys' lists \['path'\]"):
        _spec(_Bare, run_keys=("path",))


def test_a_run_key_its_kind_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'seed' is not one of \('path',\)"):
        _spec(_WithPath, run_keys=("seed",))


def test_a_field_that_shares_a_run_keys_name_is_not_declared_by_default() -> None:
    assert _spec(_WithPath).trait("run_keys") == ()
    assert _spec(_WithPath, run_keys=("path",)).trait("run_keys") == ("path",)


def test_every_first_party_component_declares_the_run_keys_its_config_has() -> None:
    missing = []
    for component in PluginManager().components():
        spec = component.spec
        table = RUN_KEYS.get(spec.kind.value)
        if table is None or spec.name not in FIRST_PARTY.get(spec.kind, {}):
            continue
        undeclared = sorted(
            set(table) & set(spec.config.model_fields) - set(spec.trait("run_keys"))
        )
        if undeclared:
            missing.append(f"{spec.key}: {undeclared}")
    assert not missing, f"first-party components with run keys they do not declare: {missing}"
