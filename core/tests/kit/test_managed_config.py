"""The config keys and component spec every managed trainer backend shares: the keys of each
settings base in one frozen model that refuses unknown keys, and the spec's traits."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError
from rllm_core.algorithms.native_losses import NATIVE_KERNELS
from rllm_core.kit.managed.config import ManagedTrainerSettings, managed_trainer_spec
from rllm_core.plugins import Credential


class Hosted(ManagedTrainerSettings):
    model: str = "owner/base"
    seed: int | None = 0
    logprob_temperature: float = 1.0
    api_key: str | None = Field(None, description="the service's API key")


CREDENTIAL = Credential(what="Service API key", env=("SERVICE_API_KEY",), key="api_key")


def test_the_keys_of_every_base_with_their_defaults():
    config = ManagedTrainerSettings()
    assert config.request_timeout_s == 900.0 and config.retries == 3
    assert config.learning_rate == 1e-4 and config.betas == (0.9, 0.999)
    assert config.loss_path == "auto" and config.vocab_size is None


@pytest.mark.parametrize(
    ("keys", "refused"),
    [
        ({"learning_rte": 1e-5}, "learning_rte"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"weight_decay": float("nan")}, "weight_decay"),
        ({"request_timeout_s": 0.0}, "request_timeout_s"),
        ({"loss_path": "fused"}, "loss_path"),
        ({"vocab_size": 0}, "vocab_size"),
        # Without a model key the old name is just an unknown key.
        ({"base_model": "owner/x"}, "base_model"),
    ],
)
def test_unknown_keys_bad_values_and_non_finite_numbers_are_refused(keys, refused):
    with pytest.raises(ValidationError, match=refused):
        ManagedTrainerSettings(**keys)


def test_a_config_is_frozen():
    config = ManagedTrainerSettings()
    with pytest.raises(ValidationError, match="frozen"):
        config.learning_rate = 1.0
    assert config.learning_rate == 1e-4


def test_a_backend_config_with_a_model_key_reads_base_model_as_model():
    with pytest.warns(DeprecationWarning, match="base_model is the old name of model"):
        config = Hosted(base_model="owner/old")
    assert config.model == "owner/old"


def test_the_spec_is_a_hosted_trainer_backend_running_every_native_kernel():
    def factory(config):
        return config

    spec = managed_trainer_spec(
        name="Service",
        factory=factory,
        config=Hosted,
        summary="Trains on a service.",
        credential=CREDENTIAL,
    )
    assert spec.key == "trainer_backend:service"
    assert spec.factory is factory and spec.config is Hosted
    assert spec.credentials == (CREDENTIAL,)
    assert dict(spec.traits) == {
        "run_keys": ("seed", "logprob_temperature", "tokenizer"),
        "publishes_weights": True,
        "hosted_model": True,
        "native_losses": NATIVE_KERNELS,
        "reference_kl_refusal": (
            "the backend scores tokens under the policy it trains only and asks its service "
            "for no base-model logprobs"
        ),
        "entropy_refusal": (
            "its service returns per-token logprobs, not the logits an entropy needs"
        ),
    }


def test_the_spec_needs_a_config_with_the_run_keys_and_the_credential_keys():
    with pytest.raises(ValueError, match=r"run_keys.*\['seed', 'logprob_temperature'\]"):
        managed_trainer_spec(
            name="service",
            factory=dict,
            config=ManagedTrainerSettings,
            summary="A service.",
            credential=CREDENTIAL,
        )
    with pytest.raises(ValueError, match=r"names keys its config lacks: \['token'\]"):
        managed_trainer_spec(
            name="service",
            factory=dict,
            config=Hosted,
            summary="A service.",
            credential=Credential(what="Service token", env=("SERVICE_TOKEN",), key="token"),
        )
