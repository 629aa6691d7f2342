"""``VllmSampler`` keeps fake vLLM servers (real HTTP, vLLM's endpoints and state) on the
trainer's policy: adapters loaded everywhere, versions stamped per request, older adapters
unloaded, failed loads retried then reported, restarted servers restored, full-weight reloads
with a prefix cache reset."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rllm_core.errors import ComponentError, UpstreamError
from rllm_core.kit.retry import RetrySettings
from rllm_core.ports import PolicyFollower, Sampler, WorkerPool
from rllm_core.routing import routed
from rllm_core.testing.fakevllm import FakeVllmServer, Served
from rllm_core.types import ExportedWeights, SampleRequest, SamplingParams
from rllm_sampler_vllm.follower import VllmSampler, _Unreachable

PROMPT = [101, 7, 8, 9]
PARAMS = SamplingParams(max_tokens=8, stop_token_ids=(2,))
FAST = RetrySettings(retries=3, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
# What the sampler's worker extension adds to a server (nothing to refresh on a fake).
EXTENSION = {"rllm_refresh_tied_weights": lambda: []}


@pytest.fixture
def servers():
    """``servers(n, **options)`` starts ``n`` fake vLLM servers; all stop after the test."""
    started: list[FakeVllmServer] = []

    def start(n: int = 1, **options) -> list[FakeVllmServer]:
        new = [FakeVllmServer(**options) for _ in range(n)]
        for server in new:
            server.start()
        started.extend(new)
        return new

    yield start
    for server in started:
        server.stop()


def export(root: Path, version: int, kind: str = "lora", rank: int = 8) -> ExportedWeights:
    """A folder shaped like what the trainer writes for ``version``."""
    folder = root / f"v{version}"
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "lora":
        (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    else:
        (folder / "config.json").write_text("{}")
    return ExportedWeights(
        path=str(folder), version=version, kind=kind, base_model="base", lora_rank=rank
    )


def sampler_for(servers, root: Path, **options) -> VllmSampler:
    options.setdefault("retry", FAST)
    options.setdefault("health_interval_s", 0.05)
    options.setdefault("retry_budget_s", 10.0)
    return VllmSampler([s.url for s in servers], model="base", weights_dir=str(root), **options)


@contextlib.asynccontextmanager
async def opened(servers, root: Path, **options) -> AsyncIterator[VllmSampler]:
    sampler = sampler_for(servers, root, **options)
    try:
        yield sampler
    finally:
        await sampler.aclose()


async def sample(sampler: VllmSampler, key: str = "s"):
    with routed(key):
        return await sampler.sample(SampleRequest(prompt_token_ids=PROMPT, params=PARAMS))


def test_it_is_a_sampler_a_worker_pool_and_a_policy_follower(tmp_path):
    sampler = VllmSampler(["http://127.0.0.1:1"], weights_dir=str(tmp_path))
    assert isinstance(sampler, Sampler)
    assert isinstance(sampler, WorkerPool)
    assert isinstance(sampler, PolicyFollower)
    assert sampler.export_path(3) == str(tmp_path / "v3")


def test_export_path_without_weights_dir_says_which_key_to_set():
    sampler = VllmSampler(["http://127.0.0.1:1"])
    with pytest.raises(ComponentError, match=r"no weights_dir.*version 4.*\[sampler\] weights_dir"):
        sampler.export_path(4)


def test_adapters_load_on_every_server_and_new_requests_name_the_newest(servers, tmp_path):
    fakes = servers(2)

    async def main():
        async with opened(fakes, tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1))
            first = [await sample(sampler, f"k{i}") for i in range(6)]
            await sampler.update_weights(export(tmp_path, 2))
            second = [await sample(sampler, f"k{i}") for i in range(6)]
            return first, second, sampler.sync_metrics()

    first, second, metrics = asyncio.run(main())
    for fake in fakes:
        assert fake.adapters == {
            "policy-v1": str(tmp_path / "v1"),
            "policy-v2": str(tmp_path / "v2"),
        }
        assert fake.loads == 2
    assert [r.weight_version for r in first] == [1] * 6
    assert [r.weight_version for r in second] == [2] * 6
    served = [s for fake in fakes for s in fake.completions]
    assert sorted(s.model for s in served) == ["policy-v1"] * 6 + ["policy-v2"] * 6
    assert all(s.version == int(s.model.rpartition("v")[2]) for s in served)
    assert all(fake.completions for fake in fakes), "both servers took requests"
    assert metrics["vllm/weight_syncs"] == 2.0 and metrics["vllm/restores"] == 0.0


def test_keep_adapters_leaves_that_many_older_adapters_loaded(servers, tmp_path):
    fakes = servers(2)

    async def main(keep: int):
        async with opened(fakes, tmp_path, keep_adapters=keep) as sampler:
            for version in (1, 2, 3, 4):
                await sampler.update_weights(export(tmp_path, version))

    asyncio.run(main(1))
    for fake in fakes:
        assert fake.loaded() == ["policy-v3", "policy-v4"]
        assert fake.unloads == 2
    for fake in fakes:
        fake.adapters.clear()
    asyncio.run(main(0))
    assert [fake.loaded() for fake in fakes] == [["policy-v4"], ["policy-v4"]]


def test_a_request_in_flight_during_an_update_keeps_its_version(servers, tmp_path):
    (fake,) = servers(1, delay_s=0.4)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1))
            slow = asyncio.create_task(sample(sampler, "a"))
            while fake.in_flight == 0:
                await asyncio.sleep(0.01)
            await sampler.update_weights(export(tmp_path, 2))
            fresh = await sample(sampler, "b")
            return await slow, fresh

    slow, fresh = asyncio.run(main())
    assert (slow.weight_version, fresh.weight_version) == (1, 2)
    assert fake.completions == [
        Served(model="policy-v1", path=str(tmp_path / "v1"), version=1),
        Served(model="policy-v2", path=str(tmp_path / "v2"), version=2),
    ]


def test_a_failed_load_is_retried(servers, tmp_path):
    (fake,) = servers(1)
    fake.fail_next_loads(2, status=503)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1))
            return await sample(sampler)

    assert asyncio.run(main()).weight_version == 1
    assert [path for path, _ in fake.calls].count("/v1/load_lora_adapter") == 3
    assert fake.loaded() == ["policy-v1"]


def test_a_load_that_keeps_failing_fails_the_update_naming_server_adapter_and_answer(
    servers, tmp_path
):
    (fake,) = servers(1)
    fake.fail_next_loads(10, status=500, message="CUDA out of memory")

    async def main():
        async with opened(
            [fake], tmp_path, retry=RetrySettings(retries=2, retry_backoff_s=0)
        ) as sampler:
            with pytest.raises(UpstreamError) as caught:
                await sampler.update_weights(export(tmp_path, 1))
            return str(caught.value), sampler.policy

    message, policy = asyncio.run(main())
    assert fake.url in message
    assert "'policy-v1'" in message and str(tmp_path / "v1") in message
    assert "HTTP 500: CUDA out of memory (after 3 attempts)" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in message
    assert (policy.model, policy.version) == ("base", 0), "nothing switched to the new adapter"


def test_a_load_the_server_refuses_is_not_retried(servers, tmp_path):
    (fake,) = servers(1, max_lora_rank=8)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            with pytest.raises(UpstreamError, match="greater than max_lora_rank 8") as caught:
                await sampler.update_weights(export(tmp_path, 1, rank=16))
            return str(caught.value)

    assert "after" not in asyncio.run(main())
    assert [path for path, _ in fake.calls] == ["/v1/load_lora_adapter"]


def test_a_server_without_runtime_lora_is_named_with_the_flags_it_needs(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1))

    with pytest.raises(UpstreamError, match=r"HTTP 404: Not Found.*--enable-lora"):
        asyncio.run(main())


def test_a_server_that_restarted_gets_its_adapter_back_before_serving(servers, tmp_path):
    (fake,) = servers(1)

    async def main():
        async with opened([fake], tmp_path, health_interval_s=0) as sampler:
            await sampler.update_weights(export(tmp_path, 1))
            await sampler.update_weights(export(tmp_path, 2))
            fake.restart(down_s=0.0, refuse=False)  # back before anyone noticed
            result = await sample(sampler)
            return result, sampler.restores()

    result, restores = asyncio.run(main())
    assert result.weight_version == 2
    assert restores == 1
    assert fake.loaded() == ["policy-v2"]
    assert fake.completions == [Served(model="policy-v2", path=str(tmp_path / "v2"), version=2)]


def test_a_server_that_was_down_is_restored_when_it_comes_back(servers, tmp_path):
    fakes = servers(2)

    async def main():
        async with opened(fakes, tmp_path) as sampler:
            await sampler.start()
            await sampler.update_weights(export(tmp_path, 1))
            fakes[1].restart(down_s=0.5, refuse=True)
            # Down while the trainer steps: the update goes to the server that is up.
            await sampler.update_weights(export(tmp_path, 2))
            down = [w.healthy for w in sampler.status()]
            for _ in range(200):
                if all(w.healthy for w in sampler.status()):
                    break
                await asyncio.sleep(0.02)
            results = [await sample(sampler, f"k{i}") for i in range(6)]
            return down, results, sampler.restores()

    down, results, restores = asyncio.run(main())
    assert down == [True, False]
    assert restores == 1
    assert fakes[1].loaded() == ["policy-v2"]
    assert {r.weight_version for r in results} == {2}
    assert fakes[1].completions and all(s.model == "policy-v2" for s in fakes[1].completions)


def test_a_restore_that_overlaps_an_update_gives_the_worker_the_newer_version(servers, tmp_path):
    fakes = servers(2)
    release = asyncio.Event()

    async def main():
        sampler = sampler_for(fakes, tmp_path, health_interval_s=0)
        load = sampler._load
        restoring_v1 = asyncio.Event()

        async def gated(worker, name, path):
            if worker.url == fakes[1].url and not release.is_set():
                if name == "policy-v1":
                    restoring_v1.set()
                    await release.wait()
                elif name == "policy-v2":
                    raise _Unreachable(f"{worker.url} is down")
            return await load(worker, name, path)

        try:
            await sampler.update_weights(export(tmp_path, 1))
            fakes[1].restart(down_s=0.0, refuse=False)
            sampler._mark_down(sampler._workers[1], "it restarted")
            sampler._load = gated
            # The health check's restore reads version 1; version 2 lands (missing the worker,
            # still down) before the restore ends.
            checking = asyncio.ensure_future(sampler.check_health())
            await restoring_v1.wait()
            await sampler.update_weights(export(tmp_path, 2))
            release.set()
            await checking
            restored = fakes[1].loaded()
            results = [await sample(sampler, f"k{i}") for i in range(6)]
            return restored, results, sampler.restores()
        finally:
            await sampler.aclose()

    restored, results, restores = asyncio.run(main())
    assert restored == ["policy-v1", "policy-v2"]
    assert restores == 1
    assert {r.weight_version for r in results} == {2}
    assert fakes[1].completions and all(s.model == "policy-v2" for s in fakes[1].completions)


def test_full_weights_reload_every_server_and_reset_the_prefix_cache(servers, tmp_path):
    refreshed_after: list[str | None] = []
    fakes = servers(2, runtime_lora=False)
    for fake in fakes:
        fake.worker_methods["rllm_refresh_tied_weights"] = lambda fake=fake: (
            refreshed_after.append(fake.weights_path) or ["lm_head"]
        )

    async def main():
        async with opened(fakes, tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))
            first = [await sample(sampler, f"k{i}") for i in range(4)]
            await sampler.update_weights(export(tmp_path, 2, kind="full"))
            second = [await sample(sampler, f"k{i}") for i in range(4)]
            return first, second

    first, second = asyncio.run(main())
    assert [r.weight_version for r in first + second] == [1] * 4 + [2] * 4
    for fake in fakes:
        assert fake.weights_path == str(tmp_path / "v2")
        assert (fake.reloads, fake.prefix_cache_resets, fake.served_on_stale_cache) == (2, 2, 0)
        assert [p for p, _ in fake.calls][:6] == [
            "/pause",
            "/collective_rpc",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
        ]
        assert fake.calls[1][1] == {
            "method": "reload_weights",
            "kwargs": {"weights_path": str(tmp_path / "v1")},
        }
        # The tied layers are processed again after each reload, on the weights it loaded.
        assert [m for m, _ in rpc_methods(fake)] == [
            "reload_weights",
            "rllm_refresh_tied_weights",
        ] * 2
        assert (fake.pauses, fake.paused, fake.version_tag) == (2, False, "2")
        assert {s.model for s in fake.completions} == {"base"}
    served = sorted(s.version for fake in fakes for s in fake.completions)
    assert served == [1] * 4 + [2] * 4
    assert sorted(refreshed_after) == sorted([str(tmp_path / "v1"), str(tmp_path / "v2")] * 2)


def test_a_server_without_the_worker_extension_is_reloaded_and_named_once(
    servers, tmp_path, caplog
):
    (fake,) = servers(1, runtime_lora=False)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            for version in (1, 2):
                await sampler.update_weights(export(tmp_path, version, kind="full"))
            return await sample(sampler)

    with caplog.at_level("WARNING", logger="rllm_sampler_vllm.follower"):
        result = asyncio.run(main())
    assert result.weight_version == 2
    assert fake.weights_path == str(tmp_path / "v2")
    # Asked once, not retried (the worker raised), not asked again at the next reload.
    assert [m for m, _ in rpc_methods(fake)] == [
        "reload_weights",
        "rllm_refresh_tied_weights",
        "reload_weights",
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert fake.url in warnings[0]
    assert "--worker-extension-cls rllm_vllm_worker.WorkerExtension" in warnings[0]
    assert "PYTHONPATH=" in warnings[0] and "vllm_worker" in warnings[0]


def test_a_refresh_the_worker_fails_fails_the_update_and_resumes_the_server(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)
    fake.worker_methods["rllm_refresh_tied_weights"] = lambda: 1 / 0

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(main())
    message = str(caught.value)
    assert fake.url in message and "division by zero" in message
    assert [m for m, _ in rpc_methods(fake)] == ["reload_weights", "rllm_refresh_tied_weights"]
    assert (fake.paused, fake.version_tag) == (False, "default")


def test_a_full_update_waits_for_requests_in_flight(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False, delay_s=0.4)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))
            slow = asyncio.create_task(sample(sampler, "a"))
            while fake.in_flight == 0:
                await asyncio.sleep(0.01)
            await sampler.update_weights(export(tmp_path, 2, kind="full"))
            return await slow, await sample(sampler, "b")

    slow, fresh = asyncio.run(main())
    assert (slow.weight_version, fresh.weight_version) == (1, 2)
    assert [s.version for s in fake.completions] == [1, 2]


def test_a_reload_that_keeps_failing_fails_the_update(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)
    fake.fail_next_reloads(10, status=500, message="weights do not match the model")

    async def main():
        async with opened(
            [fake], tmp_path, retry=RetrySettings(retries=1, retry_backoff_s=0)
        ) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(main())
    message = str(caught.value)
    assert fake.url in message and str(tmp_path / "v1") in message
    assert "weights do not match the model (after 2 attempts)" in message
    assert "VLLM_SERVER_DEV_MODE=1" in message
    assert fake.weights_path is None


def test_a_restarted_server_gets_full_weights_back(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.start()
            await sampler.update_weights(export(tmp_path, 3, kind="full"))
            fake.restart(down_s=0.3, refuse=True)
            result = await sample(sampler)
            return result, sampler.restores()

    result, restores = asyncio.run(main())
    assert result.weight_version == 3
    assert restores == 1
    assert fake.weight_version == 3
    assert fake.completions == [Served(model="base", path=str(tmp_path / "v3"), version=3)]


def rpc_methods(fake: FakeVllmServer) -> list[tuple[str, dict]]:
    """The ``/collective_rpc`` calls ``fake`` saw: each method and its keyword arguments."""
    return [
        (payload["method"], payload.get("kwargs", {}))
        for path, payload in fake.calls
        if path == "/collective_rpc"
    ]


def test_older_vllm_reloads_full_weights_through_update_config(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False, legacy_reload=True, worker_methods=EXTENSION)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))
            return await sample(sampler)

    result = asyncio.run(main())
    folder = str(tmp_path / "v1")
    assert result.weight_version == 1
    assert (fake.weights_path, fake.version_tag, fake.paused) == (folder, "1", False)
    assert [p for p, _ in fake.calls] == [
        "/pause",
        "/collective_rpc",
        "/collective_rpc",
        "/collective_rpc",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]
    # The refused weights_path is not retried: the worker raised it.
    assert rpc_methods(fake) == [
        ("reload_weights", {"weights_path": folder}),
        ("update_config", {}),
        ("reload_weights", {}),
        ("rllm_refresh_tied_weights", {}),
    ]
    assert fake.calls[2][1]["args"] == [{"model_config": {"model": folder}}]
    assert fake.completions == [Served(model="base", path=folder, version=1)]


class _NoPause(FakeVllmServer):
    """A vLLM older than ``/pause`` and ``/resume``: both answer 404."""

    def _routes(self):
        routes = super()._routes()
        del routes[("POST", "/pause")], routes[("POST", "/resume")]
        return routes


def test_a_server_without_pause_is_reloaded_without_pausing(tmp_path):
    fake = _NoPause(runtime_lora=False, worker_methods=EXTENSION)
    fake.start()

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 2, kind="full"))
            return await sample(sampler)

    try:
        result = asyncio.run(main())
    finally:
        fake.stop()
    assert result.weight_version == 2
    assert fake.weights_path == str(tmp_path / "v2")
    assert (fake.pauses, fake.paused, fake.version_tag) == (0, False, "2")
    assert [p for p, _ in fake.calls] == [
        "/collective_rpc",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
    ]


class _BusyCache(FakeVllmServer):
    """Answers ``/reset_prefix_cache`` with ``{"success": false}`` the first ``busy`` times,
    as vLLM does while a request still holds cache blocks."""

    busy = 0

    def _reset_cache(self, payload):
        if self.busy:
            self.busy -= 1
            return 200, json.dumps({"success": False}).encode()
        return super()._reset_cache(payload)


@pytest.fixture
def busy_cache(monkeypatch):
    monkeypatch.setattr("rllm_sampler_vllm.follower._CACHE_RESET_TRIES", 5)
    monkeypatch.setattr("rllm_sampler_vllm.follower._CACHE_RESET_WAIT_S", 0.01)
    started: list[_BusyCache] = []

    def start(busy: int) -> _BusyCache:
        fake = _BusyCache(runtime_lora=False)
        fake.busy = busy
        fake.start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


def test_a_prefix_cache_reset_that_answers_false_is_tried_again(busy_cache, tmp_path):
    fake = busy_cache(3)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))
            return await sample(sampler)

    result = asyncio.run(main())
    assert result.weight_version == 1
    assert [p for p, _ in fake.calls].count("/reset_prefix_cache") == 4
    assert (fake.prefix_cache_resets, fake.served_on_stale_cache, fake.paused) == (1, 0, False)
    assert fake.version_tag == "1"


def test_a_prefix_cache_that_never_resets_fails_the_update(busy_cache, tmp_path):
    fake = busy_cache(100)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            with pytest.raises(UpstreamError) as caught:
                await sampler.update_weights(export(tmp_path, 1, kind="full"))
            return str(caught.value), sampler.policy

    message, policy = asyncio.run(main())
    assert fake.url in message and str(tmp_path / "v1") in message
    assert 'reset_prefix_cache kept answering {"success": false}' in message
    assert "after 5 tries" in message
    assert [p for p, _ in fake.calls].count("/reset_prefix_cache") == 5
    assert "/update_weight_version" not in [p for p, _ in fake.calls]
    assert (fake.paused, fake.version_tag) == (False, "default"), "resumed, never tagged"
    assert (policy.model, policy.version) == ("base", 0)


def test_a_folder_without_config_json_is_refused_before_anything_is_sent(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)
    folder = tmp_path / "v1"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"half-written")
    exported = ExportedWeights(path=str(folder), version=1, kind="full", base_model="base")

    async def main():
        async with opened([fake], tmp_path) as sampler:
            with pytest.raises(UpstreamError) as caught:
                await sampler.update_weights(exported)
            return str(caught.value)

    message = asyncio.run(main())
    assert f"{folder} has no config.json" in message
    assert "refused before sending" in message
    assert fake.calls == []
    assert (fake.engine_dead, fake.weights_path, fake.paused) == (False, None, False)


def test_a_500_the_worker_raised_is_final_but_another_500_is_retried(servers, tmp_path):
    (fake,) = servers(1, max_lora_rank=8)

    async def main():
        async with opened([fake], tmp_path) as sampler:
            started = time.perf_counter()
            with pytest.raises(UpstreamError) as caught:
                await sampler.update_weights(export(tmp_path, 1, rank=16))
            elapsed = time.perf_counter() - started
            refused_calls = [p for p, _ in fake.calls]
            fake.calls.clear()
            fake.fail_next_loads(1, status=500, message="injected")
            await sampler.update_weights(export(tmp_path, 2, rank=8))
            return str(caught.value), elapsed, refused_calls, await sample(sampler)

    message, elapsed, refused_calls, result = asyncio.run(main())
    assert "HTTP 500" in message and "greater than max_lora_rank 8" in message
    assert "attempts" not in message
    assert refused_calls == ["/v1/load_lora_adapter"]
    assert elapsed < 1.0
    assert [p for p, _ in fake.calls] == ["/v1/load_lora_adapter"] * 2
    assert fake.loaded() == ["policy-v2"]
    assert result.weight_version == 2


def test_an_adapter_name_loaded_from_another_folder_is_loaded_again_in_place(servers, tmp_path):
    (fake,) = servers(1)
    fake.adapters["policy-v3"] = "/elsewhere/v3"  # left by an earlier run

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 3))
            return await sample(sampler)

    result = asyncio.run(main())
    folder = str(tmp_path / "v3")
    assert fake.adapters == {"policy-v3": folder}
    assert [p for p, _ in fake.calls] == [
        "/v1/load_lora_adapter",
        "/v1/models",
        "/v1/load_lora_adapter",
    ]
    assert fake.calls[2][1] == {"lora_name": "policy-v3", "lora_path": folder, "load_inplace": True}
    assert result.weight_version == 3
    assert fake.completions == [Served(model="policy-v3", path=folder, version=3)]


def test_an_adapter_name_loaded_from_the_same_folder_is_not_loaded_again(servers, tmp_path):
    (fake,) = servers(1)
    folder = str(tmp_path / "v3")
    fake.adapters["policy-v3"] = folder

    async def main():
        async with opened([fake], tmp_path) as sampler:
            await sampler.update_weights(export(tmp_path, 3))
            return await sample(sampler)

    result = asyncio.run(main())
    assert fake.adapters == {"policy-v3": folder}
    assert [p for p, _ in fake.calls] == ["/v1/load_lora_adapter", "/v1/models"]
    assert fake.loads == 0
    assert result.weight_version == 3


def test_a_server_serving_its_startup_weights_again_is_restored_by_health_checks(servers, tmp_path):
    (fake,) = servers(1, runtime_lora=False)
    folder = str(tmp_path / "v1")

    async def main():
        async with opened([fake], tmp_path, health_interval_s=0) as sampler:
            await sampler.update_weights(export(tmp_path, 1, kind="full"))
            fake.restart(down_s=0.01, refuse=False)
            await asyncio.sleep(0.03)  # healthy again, on the weights it started with
            assert (fake.weights_path, fake.version_tag) == (None, "default")
            await sampler.check_health()
            down = sampler.status()[0]
            await sampler.check_health()
            return down, sampler.status()[0], sampler.sync_metrics(), await sample(sampler)

    down, up, metrics, result = asyncio.run(main())
    assert down.healthy is False
    assert "weight version 'default', not 1" in down.last_error
    assert up.healthy is True
    assert (fake.weights_path, fake.version_tag, fake.reloads) == (folder, "1", 2)
    assert metrics["vllm/restores"] == 1.0
    assert result.weight_version == 1
    assert fake.completions == [Served(model="base", path=folder, version=1)]
