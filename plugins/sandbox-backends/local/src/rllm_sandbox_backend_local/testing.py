"""For test suites that need the bubblewrap sandbox: skip without it, fail in CI.

``require_bubblewrap()`` returns when bubblewrap can isolate a sandbox on this machine. When
it cannot, the test is skipped with the reason and how to install it, except where the
environment sets ``CI=true``: CI installs bubblewrap, so there the test fails instead of
hiding a broken setup. Needs pytest (imported when called).
"""

from __future__ import annotations

import functools
import os

from rllm_sandbox_backend_local.bwrap import probe

__all__ = ["require_bubblewrap"]


@functools.cache
def _problem() -> str | None:
    return probe("bwrap")


def require_bubblewrap(needed_for: str = "run Harbor tasks") -> None:
    """Skip (or, in CI, fail) the calling test unless bubblewrap works; ``needed_for`` ends
    the message ("...; install bubblewrap (apt-get install bubblewrap) to <needed_for>")."""
    import pytest

    problem = _problem()
    if problem is None:
        return
    message = f"{problem}; install bubblewrap (apt-get install bubblewrap) to {needed_for}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
