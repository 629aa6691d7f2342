"""The side environment harbor runs in: a venv of a Python 3.12 (or newer) interpreter with
the pinned ``harbor``, built once under the user cache (``<cache>/venvs/harbor-<version>``)
and reused by every run; a new harbor pin builds a new one beside it.

``python -m rllm_harness_terminus_2.sideenv [PYTHON]`` builds it and prints its interpreter.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from rllm_core.errors import AssetError
from rllm_core.sidevenvs import SideVenv, ensure, find_python, side_venv_python

__all__ = ["HARBOR", "HARBOR_VERSION", "MIN_PYTHON", "side_python"]

HARBOR_VERSION = "0.26.0"
MIN_PYTHON = (3, 12)

HARBOR = SideVenv(
    name="harbor",
    version=HARBOR_VERSION,
    requirements=(f"harbor=={HARBOR_VERSION}",),
    min_python=MIN_PYTHON,
    build_command="python -m rllm_harness_terminus_2.sideenv",
)


def side_python(python: str | None = None) -> Path:
    """The side environment's interpreter, built first when missing (about a minute and
    0.5 GB the first time). ``python`` is the interpreter to build it with (the plan's
    ``[harness].python``); unset, :func:`~rllm_core.sidevenvs.find_python` finds one. A
    built environment is reused whichever interpreter built it.

    Raises :class:`~rllm_core.errors.AssetError` (``InterpreterNotFound`` when no Python
    3.12 or newer exists) saying what was tried and what to do.
    """
    ready = side_venv_python(HARBOR)
    if ready is not None:
        return ready
    base = find_python(MIN_PYTHON, python, what="harness:terminus-2 (harbor)")
    return ensure(dataclasses.replace(HARBOR, python=base))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m rllm_harness_terminus_2.sideenv [PYTHON]", file=sys.stderr)
        return 2
    try:
        print(side_python(args[0] if args else None))
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
