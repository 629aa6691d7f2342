"""Every example plan passes ``rllm-core plan check`` on a fresh machine: nothing pulled, no
credential set, nothing run yet. Each exits 0, and its warnings say what to do before running
it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rllm_core.cli import main

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "examples/quickstart/plan.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/shell-agent/plan.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/mini-swe-agent/plan.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/terminus-2/plan.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/vllm-sampler/plan.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/vllm-sampler/plan-full.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/sft-then-rl/sft.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/sft-then-rl/rl.toml": [
        "[trainer].model: './runs/sft-model'",
        "examples/sft-then-rl/sft.toml's [sft].export writes it",
        "run `rllm-core sft examples/sft-then-rl/sft.toml` first",
    ],
    "examples/distill/teacher.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/distill/plan.toml": [
        "[algorithm].advantage.teacher.model: './runs/teacher-model'",
        "examples/distill/teacher.toml's [run].export writes it",
        "run `rllm-core run examples/distill/teacher.toml` first",
    ],
    "examples/agent-quickstart/sft.toml": ["rllm-core models pull smollm2-135m-instruct"],
    "examples/agent-quickstart/rl.toml": [
        "[trainer].model: './runs/sft-model'",
        "examples/agent-quickstart/sft.toml's [sft].export writes it",
        "run `rllm-core sft examples/agent-quickstart/sft.toml` first",
    ],
    "examples/tinker-modal/plan.toml": [
        "[renderer].tokenizer:",
        "rllm-core models pull Qwen/Qwen3-8B",
        "TINKER_API_KEY is not set",
        "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are not set",
    ],
    "examples/fireworks-daytona/plan.toml": [
        "rllm-core models pull Qwen/Qwen3-8B",
        "FIREWORKS_API_KEY is not set",
        "DAYTONA_API_KEY is not set",
    ],
}


def test_every_example_plan_is_listed():
    plans = {str(p.relative_to(ROOT)) for p in ROOT.glob("examples/*/plan.toml")}
    plans |= {str(p.relative_to(ROOT)) for p in ROOT.glob("examples/sft-then-rl/*.toml")}
    plans |= {str(p.relative_to(ROOT)) for p in ROOT.glob("examples/vllm-sampler/*.toml")}
    plans |= {str(p.relative_to(ROOT)) for p in ROOT.glob("examples/agent-quickstart/*.toml")}
    plans |= {str(p.relative_to(ROOT)) for p in ROOT.glob("examples/distill/*.toml")}
    assert plans == set(EXPECTED)


@pytest.mark.parametrize("plan", sorted(EXPECTED))
def test_an_example_plan_passes_with_nothing_cached(plan, tmp_path, monkeypatch):
    # A copy without the run folders a local run leaves (an SFT export among them).
    fresh = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples", fresh / "examples", ignore=shutil.ignore_patterns("runs"))
    monkeypatch.chdir(fresh)
    monkeypatch.setenv("RLLM_CORE_CACHE", str(tmp_path / "rllm-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (
        "TINKER_API_KEY",
        "TINKER_CREDENTIAL_CMD",
        "FIREWORKS_API_KEY",
        "MODAL_TOKEN_ID",
        "MODAL_TOKEN_SECRET",
        "DAYTONA_API_KEY",
        "DAYTONA_JWT_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    done = CliRunner().invoke(main, ["plan", "check", plan])
    assert done.exit_code == 0, done.output
    assert "plan ok" in done.stdout
    warnings = " ".join(done.stderr.split())
    for expected in EXPECTED[plan]:
        assert expected in warnings, done.stderr
    assert all(
        line.startswith(f"warning: {plan}: [") for line in done.stderr.splitlines() if line
    ), done.stderr
