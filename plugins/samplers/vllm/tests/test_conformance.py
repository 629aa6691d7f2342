"""The vLLM sampler against the core's sampler conformance suite: over a fake vLLM server
(real HTTP, vLLM's endpoints, answers without a model), and, under the ``vllm`` marker, over a
real vLLM server on SmolLM2; and the suite shown to reject a refusal raised as another error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rllm_core.errors import UpstreamError
from rllm_core.kit.retry import RetrySettings
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.testing.suites.samplers import SamplerConformance
from rllm_core.types import ExportedWeights, SampleRequest, SampleResult
from rllm_sampler_vllm.follower import VllmSampler

FAST = RetrySettings(retries=2, retry_backoff_s=0.01, retry_backoff_max_s=0.05)


@pytest.fixture
def fake_server():
    server = FakeVllmServer()
    server.start()
    yield server
    server.stop()


class TestVllmOverFakeServer(SamplerConformance):
    @pytest.fixture
    def sampler(self, fake_server: FakeVllmServer, tmp_path: Path) -> VllmSampler:
        return VllmSampler(
            [fake_server.url],
            model="base",
            weights_dir=str(tmp_path / "weights"),
            retry=FAST,
            retry_budget_s=0.5,
            health_interval_s=0,
        )

    @pytest.fixture
    def publish_weights(self, sampler: VllmSampler):
        async def publish() -> int:
            version = sampler.weight_version + 1
            folder = Path(sampler.export_path(version))
            folder.mkdir(parents=True)
            (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
            await sampler.update_weights(
                ExportedWeights(
                    path=str(folder), version=version, kind="lora", base_model="b", lora_rank=8
                )
            )
            return version

        return publish

    @pytest.fixture
    def reject_next_request(self, fake_server: FakeVllmServer):
        return lambda: fake_server.fail_next(400, message="prompt too long")

    @pytest.fixture
    def make_upstream_unreachable(self, fake_server: FakeVllmServer):
        return fake_server.stop


@pytest.fixture(scope="session")
def real_vllm_server_options() -> dict[str, Any]:
    # The same options as the repository's tests/conftest.py: the server is one per session.
    from rllm_sampler_vllm.serve import REFRESH_TIED_WEIGHTS, worker_extension_launch

    args, env = worker_extension_launch()
    return {"extra_args": tuple(args), "extra_env": env, "reload_rpcs": (REFRESH_TIED_WEIGHTS,)}


@pytest.mark.vllm
class TestVllmOverRealServer(SamplerConformance):
    vocab_size = 49152
    deadline_s = 120.0

    @pytest.fixture
    def sampler(self, real_vllm_server: Any, tmp_path: Path) -> VllmSampler:
        real_vllm_server.reset()
        return VllmSampler(
            [real_vllm_server.url],
            model=real_vllm_server.served_model_name,
            weights_dir=str(tmp_path / "weights"),
            health_interval_s=0,
        )


class HidesUpstreamErrors:
    """Raises a plain RuntimeError where the pool raised an UpstreamError."""

    def __init__(self, inner: VllmSampler) -> None:
        self.inner = inner

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        try:
            return await self.inner.sample(request)
        except UpstreamError as exc:
            raise RuntimeError(str(exc)) from None
        finally:
            await self.inner.aclose()


def test_the_suite_catches_a_refusal_that_is_not_an_upstream_error(fake_server, tmp_path):
    suite = SamplerConformance()
    sampler = HidesUpstreamErrors(VllmSampler([fake_server.url], model="base", retry=FAST))
    with pytest.raises(RuntimeError, match="prompt too long"):
        suite.test_a_refused_request_raises_upstream_rejected(
            sampler, lambda: fake_server.fail_next(400, message="prompt too long")
        )
