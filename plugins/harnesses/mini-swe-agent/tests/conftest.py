"""Fixtures for the mini-swe-agent harness tests: a real gateway on an ephemeral port backed by
a scripted fake model over the toy renderer, and an in-memory trace store."""

from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
