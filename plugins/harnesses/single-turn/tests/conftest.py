"""A real gateway on an ephemeral port, backed by a scripted sampler, the toy renderer and an
in-memory trace store, for the harness tests."""

from __future__ import annotations

from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
