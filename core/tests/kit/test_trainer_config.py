"""The AdamW keys every trainer backend shares: bounds, defaults a backend replaces, and the
AdamParams keywords of Tinker-style training APIs."""

from __future__ import annotations

import pytest
from pydantic import ConfigDict, ValidationError
from rllm_core.kit.trainer_config import AdamBetas, AdamWSettings, LearningRate


class Backend(AdamWSettings):
    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: LearningRate = 1e-5
    betas: AdamBetas = (0.9, 0.95)


def test_a_backend_replaces_defaults_and_keeps_bounds_and_descriptions():
    config = Backend()
    assert (config.learning_rate, config.betas, config.eps) == (1e-5, (0.9, 0.95), 1e-8)
    shared = AdamWSettings.model_fields
    for key in ("learning_rate", "betas", "eps", "weight_decay", "max_grad_norm"):
        assert Backend.model_fields[key].description == shared[key].description
    with pytest.raises(ValidationError, match="learning_rate"):
        Backend(learning_rate=0.0)
    with pytest.raises(ValidationError, match=r"each of betas must be in \[0, 1\)"):
        Backend(betas=(0.9, 1.0))
    with pytest.raises(ValidationError, match=r"each of betas must be in \[0, 1\)"):
        AdamWSettings(betas=(-0.1, 0.9))
    with pytest.raises(ValidationError, match="eps"):
        Backend(eps=0.0)


def test_adam_params_name_each_setting_as_the_training_apis_do():
    config = Backend(eps=1e-12, weight_decay=0.01, max_grad_norm=0.5)
    assert config.adam_params() == {
        "learning_rate": 1e-5,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-12,
        "weight_decay": 0.01,
        "grad_clip_norm": 0.5,
    }
