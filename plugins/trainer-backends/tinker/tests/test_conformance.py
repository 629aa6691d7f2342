"""The tinker backend over the fake Tinker service against the core's trainer backend
conformance suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rllm_core.testing.suites.trainer_backends import TrainerBackendConformance
from rllm_core.types import SampleRequest, SamplingParams
from rllm_trainer_backend_tinker import plugin
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import FakeService

SPEC = next(spec for spec in plugin.rllm_trainer_backends() if spec.name == "tinker")


class TestTinkerOverFake(TrainerBackendConformance):
    @pytest.fixture
    def build_trainer_backend(self) -> Callable[[], TinkerBackend]:
        # One service for every backend: a state saved by one loads into another.
        service = FakeService()
        config = TinkerBackendConfig(learning_rate=0.1)
        return lambda: TinkerBackend(config, service_client=service)

    @pytest.fixture
    def trainer_backend_spec(self):
        return SPEC

    @pytest.fixture
    def sample_request(self) -> SampleRequest:
        # The fake's sampler walks a table of VOCAB tokens.
        return SampleRequest(prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=3))
