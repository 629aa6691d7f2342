"""The entry module: what it registers and building from config keys."""

from __future__ import annotations

import asyncio

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_sampler_vllm import plugin
from rllm_sampler_vllm.pool import HttpWorkerPool


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="vllm", distribution="rllm-sampler-vllm")
    return pm


def test_builds_from_config_keys(manager):
    pool = manager.get("sampler", "vllm").build(
        {
            "urls": ["http://10.0.0.5:8000/", "http://10.0.0.6:8000"],
            "model": "served-name",
            "api_key": "k",
            "retries": 7,
            "retry_backoff_s": 0.5,
            "retry_backoff_max_s": 4.0,
            "retry_budget_s": 20.0,
            "request_timeout_s": 30.0,
            "health_interval_s": 2.0,
        }
    )
    try:
        assert isinstance(pool, HttpWorkerPool)
        assert [w.url for w in pool.status()] == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
        assert pool.model == "served-name"
        assert (pool.retry.retries, pool.retry.retry_backoff_s) == (7, 0.5)
        assert pool.retry.retry_backoff_max_s == 4.0
        assert (pool.retry_budget_s, pool.request_timeout_s) == (20.0, 30.0)
        assert pool.health_interval_s == 2.0
    finally:
        asyncio.run(pool.aclose())


def test_defaults_are_those_of_the_retry_keys(manager):
    config = manager.get("sampler", "vllm").validate_config({"urls": ["http://127.0.0.1:8000"]})
    assert (config.retries, config.retry_backoff_s, config.retry_backoff_max_s) == (3, 1.0, 30.0)
    assert (config.model, config.api_key) == (None, None)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"urls": []},
        {"urls": ["http://127.0.0.1:8000"], "max_attempts": 5},
        {"urls": ["http://127.0.0.1:8000"], "retries": -1},
        {"urls": ["http://127.0.0.1:8000"], "retry_budget_s": 0},
    ],
)
def test_bad_config_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("sampler", "vllm").validate_config(values)


def test_a_bad_url_names_itself(manager):
    with pytest.raises(ValueError, match="worker URL 'localhost:8000' is invalid"):
        manager.get("sampler", "vllm").build({"urls": ["localhost:8000"]})
