"""Shared fixtures for the cross-package tests.

Packages are discovered by glob, never listed by hand: every ``plugins/<kind>/<name>/`` with a
``pyproject.toml`` is a first-party plugin, every ``examples/<name>/`` whose ``pyproject.toml``
declares an ``rllm_core`` entry point is an example plugin package. A test that takes a
``plugin_package`` argument runs once per first-party plugin, one that takes ``entry_package``
once per first-party plugin and example package; the test id is the package's folder.

Subprocesses run without ``RLLM_CORE_DISABLE_PLUGINS`` and ``RLLM_CORE_STRICT_PLUGINS`` from the
developer's shell, so those settings cannot change what a test sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT_GROUP = "rllm_core"
PLUGIN_ENV_VARS = ("RLLM_CORE_DISABLE_PLUGINS", "RLLM_CORE_STRICT_PLUGINS")


@dataclass(frozen=True)
class Package:
    """One installable package of the repository, as its ``pyproject.toml`` describes it."""

    folder: Path
    distribution: str
    dependencies: tuple[str, ...]
    entry_points: tuple[tuple[str, str], ...]

    @property
    def id(self) -> str:
        """The folder relative to the repository root, e.g. ``plugins/losses/ppo``."""
        return self.folder.relative_to(REPO_ROOT).as_posix()

    @property
    def entry_modules(self) -> list[str]:
        """The modules named by the package's ``rllm_core`` entry points."""
        return sorted({value.partition(":")[0].strip() for _, value in self.entry_points})


def read_package(folder: Path) -> Package:
    pyproject = folder / "pyproject.toml"
    with pyproject.open("rb") as handle:
        project = tomllib.load(handle).get("project", {})
    name = project.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{pyproject} has no [project].name; every package needs one")
    entry_points = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return Package(
        folder=folder,
        distribution=name,
        dependencies=tuple(project.get("dependencies", ())),
        entry_points=tuple(sorted(entry_points.items())),
    )


def discover_plugins() -> list[Package]:
    return [read_package(p.parent) for p in sorted(REPO_ROOT.glob("plugins/*/*/pyproject.toml"))]


def discover_examples() -> list[Package]:
    found = [read_package(p.parent) for p in sorted(REPO_ROOT.glob("examples/*/pyproject.toml"))]
    return [package for package in found if package.entry_points]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "plugin_package" in metafunc.fixturenames:
        plugins = discover_plugins()
        metafunc.parametrize("plugin_package", plugins, ids=[p.id for p in plugins])
    if "entry_package" in metafunc.fixturenames:
        packages = discover_plugins() + discover_examples()
        metafunc.parametrize("entry_package", packages, ids=[p.id for p in packages])


@pytest.fixture(scope="session")
def real_vllm_server_options() -> dict[str, Any]:
    """The shared real vLLM server runs with the vLLM sampler's worker extension, as the
    servers ``[sampler.serve]`` starts do."""
    from rllm_sampler_vllm.serve import REFRESH_TIED_WEIGHTS, worker_extension_launch

    args, env = worker_extension_launch()
    return {"extra_args": tuple(args), "extra_env": env, "reload_rpcs": (REFRESH_TIED_WEIGHTS,)}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def first_party_plugins() -> list[Package]:
    return discover_plugins()


@dataclass(frozen=True)
class Result:
    """A finished subprocess. ``str(result)`` is a complete failure message."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"stdout is not JSON ({exc})\n{self}") from None

    def __str__(self) -> str:
        shown = " ".join("<script>" if "\n" in arg else arg for arg in self.command)
        return (
            f"`{shown}` exited {self.returncode}\n"
            f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"
        )

    def __repr__(self) -> str:
        return f"Result(returncode={self.returncode})"


Runner = Callable[..., Result]


def _run(command: list[str], cwd: Path, env_overrides: dict[str, str]) -> Result:
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV_VARS}
    env.update(env_overrides)
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    return Result(command, done.returncode, done.stdout, done.stderr)


def cli_command() -> list[str]:
    """The CLI of the environment running the tests: its ``rllm-core`` script, or
    ``python -m rllm_core.cli`` when no script sits next to the interpreter."""
    script = Path(sys.executable).with_name("rllm-core")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "rllm_core.cli"]


@pytest.fixture
def run_cli(tmp_path: Path) -> Runner:
    """``run_cli("plugins", "--json", RLLM_CORE_DISABLE_PLUGINS="x")`` runs the CLI from a
    scratch directory; keyword arguments are extra environment variables."""

    def run(*args: str, **env: str) -> Result:
        return _run([*cli_command(), *args], tmp_path, env)

    return run


@pytest.fixture
def run_python(tmp_path: Path) -> Runner:
    """``run_python(code, *argv, **env)`` runs ``code`` in a fresh interpreter of the test
    environment, from a scratch directory so the checkout is not on ``sys.path``."""

    def run(code: str, *argv: str, **env: str) -> Result:
        return _run([sys.executable, "-c", code, *argv], tmp_path, env)

    return run


TINY_VOCAB = 256
"""The vocabulary size of :func:`tiny_model_dir`'s model."""


def save_tiny_llama(folder: Path, *, vocab: int, max_positions: int, seed: int) -> Path:
    """A seeded random two-layer Llama saved in ``folder``, small enough that a step takes
    milliseconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
    )
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random two-layer Llama small enough that a step takes milliseconds."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    return save_tiny_llama(folder, vocab=TINY_VOCAB, max_positions=32, seed=99)


@pytest.fixture(scope="session")
def tiny_smol_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_model_dir: Path) -> Path:
    """A tiny random Llama over SmolLM2's tokenizer and chat template: real chat prompts, and
    steps and weight exports that take milliseconds."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-smol")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_model_dir / name).is_file():
            shutil.copyfile(smollm2_model_dir / name, folder / name)
    vocab = len(AutoTokenizer.from_pretrained(str(smollm2_model_dir)))
    return save_tiny_llama(folder, vocab=vocab, max_positions=256, seed=7)


@pytest.fixture(scope="session")
def tiny_smol_long_model_dir(
    tmp_path_factory: pytest.TempPathFactory, tiny_smol_model_dir: Path
) -> Path:
    """The tiny SmolLM2-tokenizer Llama with room for an agent's multi-turn prompts (4096
    positions): its rotary positions need no weights, so a longer context is a config change."""
    import shutil

    folder = tmp_path_factory.mktemp("tiny-smol-long") / "model"
    shutil.copytree(tiny_smol_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def quickstart_two_steps(
    smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The quickstart plan on SmolLM2 for 2 steps of 2 tasks x 2 rollouts of 4 new tokens, a
    checkpoint after each step, its datums recorded: run once for every test that reads such a
    run. Returns the folder it ran in and the finished ``rllm-core run`` process."""
    from reference.cli_process import overrides
    from reference.cli_process import run_cli as run_process
    from reference.quickstart import PLAN, write_tasks

    cwd = tmp_path_factory.mktemp("quickstart-two-steps")
    tasks, held_out = write_tasks(cwd)
    done = run_process(
        "run",
        str(PLAN),
        "--plain",
        "--record-datums",
        *overrides(
            "run.steps=2",
            "run.save_every=1",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "sampling.max_tokens=4",
            f'tasks.path="{tasks}"',
            f'tasks.eval_path="{held_out}"',
        ),
        cwd=cwd,
        timeout=300,
        columns=200,
    )
    return cwd, done
