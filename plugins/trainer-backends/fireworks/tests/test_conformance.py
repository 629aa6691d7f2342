"""The fireworks backend over the fake Fireworks service against the core's trainer backend
conformance suite. The fake's model gives every token a fixed logprob, so weights never move:
the checks hold the backend's own bookkeeping (versions, publishing, state folders, metrics)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_fireworks import FakeService, FakeTraining, reply
from rllm_core.testing.suites.trainer_backends import TrainerBackendConformance
from rllm_trainer_backend_fireworks import plugin
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

SPEC = next(spec for spec in plugin.rllm_trainer_backends() if spec.name == "fireworks")
CONFIG = FireworksBackendConfig(model="accounts/fireworks/models/qwen3-8b", lora_rank=8)


class TestFireworksOverFake(TrainerBackendConformance):
    @pytest.fixture
    def build_trainer_backend(self) -> Callable[[], FireworksBackend]:
        # One service for every backend: a state saved by one loads into another.
        service = FakeService(
            training=FakeTraining(replies=[reply([4, 5, 2], [-0.5, -0.25, -0.1])])
        )
        return lambda: FireworksBackend(CONFIG, service=service)

    @pytest.fixture
    def trainer_backend_spec(self):
        return SPEC
