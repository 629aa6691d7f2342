"""Tests that need a program from a system package (bubblewrap, chromium): one wording for
their skips, and the line that counts them at the end of the session.

A skip reason from :func:`missing_package` reads ``needs bubblewrap (apt-get install
bubblewrap) to run Harbor tasks: 'bwrap' is not on PATH``; the kit's pytest plugin groups the
skips whose reason has that form into one line (:func:`summary_line`). ``scripts/setup.sh``
installs these packages when it runs as root.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable

__all__ = ["missing_package", "require_program", "summary_line"]

_REASON = re.compile(r"^(?:Skipped: )?needs (?P<package>[\w.+-]+) \((?P<install>[^)]+)\) ")


def missing_package(package: str, needed_for: str, detail: str) -> str:
    """The skip reason for a test that needs the Debian package ``package`` to ``needed_for``;
    ``detail`` says what is missing (``"'bwrap' is not on PATH"``)."""
    return f"needs {package} (apt-get install {package}) to {needed_for}: {detail}"


def require_program(program: str, package: str, needed_for: str) -> str:
    """The path of ``program``; without it, skip the calling test with :func:`missing_package`'s
    reason, or fail it where the environment sets ``CI=true`` (CI runs as root, so
    ``scripts/setup.sh`` installed the package there and its absence is a broken set-up)."""
    import pytest

    found = shutil.which(program)
    if found is not None:
        return found
    reason = missing_package(package, needed_for, f"{program!r} is not on PATH")
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def summary_line(reasons: Iterable[str]) -> str | None:
    """One line counting the skip ``reasons`` that name a missing package, per package
    (``skipped for missing system packages: 161 tests need bubblewrap (apt-get install
    bubblewrap), 1 test needs chromium (apt-get install chromium)``); ``None`` when none does."""
    counts: Counter[tuple[str, str]] = Counter()
    for reason in reasons:
        match = _REASON.match(reason)
        if match:
            counts[match["package"], match["install"]] += 1
    if not counts:
        return None
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    parts = [
        f"{count} {'test needs' if count == 1 else 'tests need'} {package} ({install})"
        for (package, install), count in ordered
    ]
    return "skipped for missing system packages: " + ", ".join(parts)
