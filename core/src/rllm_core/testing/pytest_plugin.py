"""Fixtures every plugin test session gets when rllm-core is installed."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rllm_conformance: a test from an rllm-core conformance suite")
