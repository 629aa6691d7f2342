"""Specs validate themselves when a plugin yields them."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError
from rllm_core import ComponentSpec, NoConfig, lazy
from rllm_core.plugins.specs import Kind, canonical_name


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = 2


def test_spec_is_frozen_and_canonical():
    spec = ComponentSpec(kind="loss", name="Clip_Higher", factory=dict, config=Config, summary="s")
    assert spec.name == "clip-higher"
    assert spec.key == "loss:clip-higher"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "-leading", "with space", "ünïcode", "a/b"])
def test_invalid_names_rejected(name):
    with pytest.raises(ValueError, match="name"):
        ComponentSpec(kind="loss", name=name, factory=dict, summary="s")


def test_summary_must_be_one_line():
    with pytest.raises(ValueError, match="one non-empty line"):
        ComponentSpec(kind="loss", name="a", factory=dict, summary="")
    with pytest.raises(ValueError, match="one non-empty line"):
        ComponentSpec(kind="loss", name="a", factory=dict, summary="two\nlines")


def test_config_must_be_a_pydantic_model():
    with pytest.raises(TypeError, match="pydantic BaseModel"):
        ComponentSpec(kind="loss", name="a", factory=dict, summary="s", config=dict)  # type: ignore[arg-type]


def test_factory_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        ComponentSpec(kind="loss", name="a", factory="not callable", summary="s")  # type: ignore[arg-type]


def test_kinds_are_the_declared_ones():
    assert [kind.value for kind in Kind][:3] == ["loss", "advantage_estimator", "renderer"]
    assert Kind("trainer_backend") is Kind.TRAINER_BACKEND
    assert Kind(Kind.LOSS) is Kind.LOSS and Kind.LOSS == "loss"
    with pytest.raises(AttributeError, match="no component kind 'widget'"):
        Kind.WIDGET  # noqa: B018
    with pytest.raises(ValueError, match="already declared by rllm_losses"):
        Kind.declare("loss", hook_name="rllm_other_losses")


def test_build_validates_config():
    spec = ComponentSpec(
        kind="renderer", name="r", factory=lambda c: c.width * 10, config=Config, summary="s"
    )
    assert spec.build() == 20
    assert spec.build({"width": 3}) == 30
    assert spec.build(Config(width=4)) == 40
    with pytest.raises(ValidationError):
        spec.build({"widht": 3})


def test_no_config_rejects_keys():
    spec = ComponentSpec(kind="renderer", name="r", factory=lambda c: c, summary="s")
    assert isinstance(spec.build(), NoConfig)
    with pytest.raises(ValidationError):
        spec.build({"anything": 1})


def test_factory_path_for_lazy_and_direct():
    assert ComponentSpec(
        kind="loss", name="a", factory=lazy("pkg.mod:Cls"), summary="s"
    ).factory_path == ("pkg.mod:Cls")
    assert ComponentSpec(kind="loss", name="a", factory=Config, summary="s").factory_path.endswith(
        ":Config"
    )


def test_lazy_resolves_nested_attributes():
    factory = lazy("json:JSONDecoder.decode")
    assert factory.resolve().__qualname__ == "JSONDecoder.decode"


def test_a_spec_takes_its_kind_by_name_and_checks_its_traits():
    loss = ComponentSpec(kind="loss", name="a", factory=dict, summary="s")
    assert loss.kind is Kind.LOSS and loss.trait("role") == "policy"
    aux = ComponentSpec(
        kind="loss", name="b", factory=dict, summary="s", traits={"role": "auxiliary"}
    )
    assert aux.trait("role") == "auxiliary"
    with pytest.raises(ValueError, match="'critic' is not one of"):
        ComponentSpec(kind="loss", name="c", factory=dict, summary="s", traits={"role": "critic"})
    with pytest.raises(ValueError, match="renderer has no trait 'role'"):
        ComponentSpec(kind="renderer", name="d", factory=dict, summary="s", traits={"role": "x"})
    with pytest.raises(ValueError, match="'widget' is not a component kind; known: loss"):
        ComponentSpec(kind="widget", name="e", factory=dict, summary="s")


def test_canonical_name():
    assert canonical_name(" DPPO_TV ") == "dppo-tv"
