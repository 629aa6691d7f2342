"""The config keys several harnesses share: their usual defaults, bounds and descriptions, and a
harness's own description keeping the bounds."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rllm_core.kit.harness_keys import MaxRetries, MaxTokens, RequestTimeout, TimeoutCap


class Harness(BaseModel):
    """A harness config declaring each key under its usual name and default."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    max_tokens: MaxTokens = None
    request_timeout_s: RequestTimeout = 600.0
    max_retries: MaxRetries = 2
    timeout_cap_s: TimeoutCap = None


class OwnWords(BaseModel):
    """A harness whose keys mean more, each with its own description."""

    max_tokens: MaxTokens = Field(None, description="tokens of each turn's completion")
    timeout_cap_s: TimeoutCap = Field(None, description="cap on the whole episode")


def test_the_usual_defaults_are_valid_and_the_optional_keys_take_none():
    config = Harness()
    assert (config.max_tokens, config.request_timeout_s, config.max_retries) == (None, 600.0, 2)
    assert config.timeout_cap_s is None
    explicit = Harness(max_tokens=1, request_timeout_s=0.5, max_retries=0, timeout_cap_s=0.1)
    assert (explicit.max_tokens, explicit.request_timeout_s) == (1, 0.5)
    assert (explicit.max_retries, explicit.timeout_cap_s) == (0, 0.1)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("request_timeout_s", 0.0),
        ("request_timeout_s", -1.0),
        ("request_timeout_s", None),
        ("request_timeout_s", float("inf")),
        ("request_timeout_s", float("nan")),
        ("max_retries", -1),
        ("max_retries", None),
        ("timeout_cap_s", 0.0),
        ("timeout_cap_s", -30.0),
        ("timeout_cap_s", float("inf")),
    ],
)
def test_out_of_bounds_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ValidationError, match=key):
        Harness(**{key: value})


def test_each_key_is_described_and_bounded_in_the_json_schema():
    properties = Harness.model_json_schema()["properties"]
    assert "gateway" in properties["max_tokens"]["description"]
    assert "seconds" in properties["request_timeout_s"]["description"]
    assert "429" in properties["max_retries"]["description"]
    assert "agent timeout" in properties["timeout_cap_s"]["description"]
    assert properties["request_timeout_s"]["exclusiveMinimum"] == 0
    assert properties["max_retries"]["minimum"] == 0
    assert {"exclusiveMinimum": 0, "type": "integer"} in properties["max_tokens"]["anyOf"]


def test_a_harness_description_replaces_the_shared_one_and_keeps_the_bound():
    properties = OwnWords.model_json_schema()["properties"]
    assert properties["max_tokens"]["description"] == "tokens of each turn's completion"
    assert properties["timeout_cap_s"]["description"] == "cap on the whole episode"
    assert OwnWords().max_tokens is None
    with pytest.raises(ValidationError, match="max_tokens"):
        OwnWords(max_tokens=0)
    with pytest.raises(ValidationError, match="timeout_cap_s"):
        OwnWords(timeout_cap_s=0.0)
