"""For test suites that need the bubblewrap sandbox: skip without it, fail in CI.

``require_bubblewrap()`` returns when bubblewrap can isolate a sandbox on this machine. When
it cannot, the test is skipped with the reason, in the wording of
:mod:`rllm_core.testing.system` when the program is missing (``needs bubblewrap (apt-get
install bubblewrap) to ...``), except where the environment sets ``CI=true``: CI installs
bubblewrap, so there the test fails instead of hiding a broken setup. ``bubblewrap_problem()``
is the same reason for a ``skipif`` mark. Needs pytest (imported when called).
"""

from __future__ import annotations

import functools
import os
import shutil

from rllm_core.testing.system import missing_package

from rllm_sandbox_backend_local.bwrap import probe

__all__ = ["bubblewrap_problem", "require_bubblewrap"]

# The programs a bubblewrap sandbox runs, and the Debian package each comes from.
_PROGRAMS = {"bwrap": "bubblewrap", "nsenter": "util-linux", "setpriv": "util-linux"}


@functools.cache
def _probe() -> str | None:
    return probe("bwrap")


def bubblewrap_problem(needed_for: str = "run Harbor tasks") -> str | None:
    """Why a test that needs a bubblewrap sandbox to ``needed_for`` cannot run here, as its
    skip reason, or ``None`` when bubblewrap works."""
    for program, package in _PROGRAMS.items():
        if shutil.which(program) is None:
            return missing_package(package, needed_for, f"{program!r} is not on PATH")
    problem = _probe()
    if problem is None:
        return None
    return f"bubblewrap cannot isolate a sandbox here, needed to {needed_for}: {problem}"


def require_bubblewrap(needed_for: str = "run Harbor tasks") -> None:
    """Skip (or, in CI, fail) the calling test unless bubblewrap works, with
    :func:`bubblewrap_problem`'s reason."""
    import pytest

    problem = bubblewrap_problem(needed_for)
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)
