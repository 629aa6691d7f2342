"""Fixtures for the Terminus-2 harness tests: a real gateway on an ephemeral port backed by a
scripted fake model over the toy renderer, an in-memory trace store, and the side
environment's interpreter (built once; the tests skip, with the reason, where no Python 3.12
or newer or no tmux exists, and fail on CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
from rllm_core.errors import AssetError


@pytest.fixture(scope="session")
def side_python() -> Path:
    from rllm_core.testing.system import require_program
    from rllm_harness_terminus_2.sideenv import side_python as build

    require_program("tmux", "tmux", "run Terminus-2's terminal")
    try:
        return build()
    except AssetError as exc:
        reason = f"needs harbor's side environment (Python 3.12 or newer): {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
