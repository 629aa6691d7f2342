"""Fixtures for the vLLM sampler tests: fake vLLM workers on ephemeral ports, and gateways
(toy renderer, in-memory trace store) serving a pool with the official ``openai`` client."""

from __future__ import annotations

from reference.gateway_fixtures import client, serve, store, toy, workers  # noqa: F401
