"""Specs validate themselves when a plugin yields them."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError
from rllm_core import LossSpec, NoConfig, RendererSpec, lazy
from rllm_core.plugins.specs import SPEC_TYPES, ComponentSpec, Kind, canonical_name


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = 2


def test_spec_is_frozen_and_canonical():
    spec = LossSpec(name="Clip_Higher", factory=dict, config=Config, summary="s")
    assert spec.name == "clip-higher"
    assert spec.key == "loss:clip-higher"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "-leading", "with space", "ünïcode", "a/b"])
def test_invalid_names_rejected(name):
    with pytest.raises(ValueError, match="name"):
        LossSpec(name=name, factory=dict, summary="s")


def test_summary_must_be_one_line():
    with pytest.raises(ValueError, match="one non-empty line"):
        LossSpec(name="a", factory=dict, summary="")
    with pytest.raises(ValueError, match="one non-empty line"):
        LossSpec(name="a", factory=dict, summary="two\nlines")


def test_config_must_be_a_pydantic_model():
    with pytest.raises(TypeError, match="pydantic BaseModel"):
        LossSpec(name="a", factory=dict, summary="s", config=dict)  # type: ignore[arg-type]


def test_factory_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        LossSpec(name="a", factory="not callable", summary="s")  # type: ignore[arg-type]


def test_base_spec_cannot_be_yielded():
    with pytest.raises(TypeError, match="kind-specific"):
        ComponentSpec(name="a", factory=dict, summary="s")


def test_build_validates_config():
    spec = RendererSpec(name="r", factory=lambda c: c.width * 10, config=Config, summary="s")
    assert spec.build() == 20
    assert spec.build({"width": 3}) == 30
    assert spec.build(Config(width=4)) == 40
    with pytest.raises(ValidationError):
        spec.build({"widht": 3})


def test_no_config_rejects_keys():
    spec = RendererSpec(name="r", factory=lambda c: c, summary="s")
    assert isinstance(spec.build(), NoConfig)
    with pytest.raises(ValidationError):
        spec.build({"anything": 1})


def test_factory_path_for_lazy_and_direct():
    assert LossSpec(name="a", factory=lazy("pkg.mod:Cls"), summary="s").factory_path == (
        "pkg.mod:Cls"
    )
    assert LossSpec(name="a", factory=Config, summary="s").factory_path.endswith(":Config")


def test_lazy_resolves_nested_attributes():
    factory = lazy("json:JSONDecoder.decode")
    assert factory.resolve().__qualname__ == "JSONDecoder.decode"


def test_one_spec_type_per_kind():
    assert set(SPEC_TYPES) == set(Kind)
    assert all(SPEC_TYPES[kind].kind is kind for kind in Kind)


def test_canonical_name():
    assert canonical_name(" DPPO_TV ") == "dppo-tv"
