"""examples/tinker-modal/plan.toml passes `rllm-core plan check` and selects what it says."""

from __future__ import annotations

import tomllib
from pathlib import Path

from reference.cli_process import plan_check

REPO = Path(__file__).resolve().parents[4]
PLAN = REPO / "examples" / "tinker-modal" / "plan.toml"


def test_plan_check_accepts_the_tinker_modal_plan():
    resolved = plan_check(PLAN, cwd=REPO)
    components = {c["where"]: c for c in resolved["components"]}
    assert components["[trainer]"]["name"] == "tinker"
    assert components["[trainer]"]["config"]["base_model"] == "Qwen/Qwen3-8B"
    assert components["[sandbox]"]["name"] == "modal"
    assert components["[harness]"]["name"] == "shell"
    assert components["[tasks]"]["config"]["path"] == str(REPO / "examples" / "tasks" / "shell")
    assert resolved["plan"]["sampling"]["temperature"] == 1.0


def test_the_plan_names_task_folders_that_exist():
    plan = tomllib.loads(PLAN.read_text(encoding="utf-8"))
    tasks = PLAN.parent / plan["tasks"]["path"]
    assert (tasks / "dataset.toml").is_file()
    assert len([p for p in tasks.iterdir() if p.is_dir()]) >= 20
