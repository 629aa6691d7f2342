"""examples/tinker-modal/plan.toml passes `rllm-core plan check` and selects what it says."""

from __future__ import annotations

import tomllib
from pathlib import Path

from reference.cli_process import plan_check, run_cli

REPO = Path(__file__).resolve().parents[4]
PLAN = REPO / "examples" / "tinker-modal" / "plan.toml"


def test_plan_check_accepts_the_tinker_modal_plan():
    resolved = plan_check(PLAN, cwd=REPO)
    components = {c["where"]: c for c in resolved["components"]}
    assert components["[trainer]"]["name"] == "tinker"
    assert components["[trainer]"]["config"]["model"] == "Qwen/Qwen3-8B"
    # the run bounds the token ids by the renderer's tokenizer (vocab_size is unset)
    tokenizer = components["[renderer]"]["config"]["tokenizer"]
    assert components["[trainer]"]["config"]["tokenizer"] == tokenizer == "Qwen/Qwen3-8B"
    assert resolved["notes"] == []
    assert components["[sandbox]"]["name"] == "modal"
    assert components["[harness]"]["name"] == "shell"
    assert components["[tasks]"]["config"]["path"] == str(REPO / "examples" / "tasks" / "shell")
    assert resolved["plan"]["sampling"]["temperature"] == 1.0


def test_the_plan_names_task_folders_that_exist():
    plan = tomllib.loads(PLAN.read_text(encoding="utf-8"))
    tasks = PLAN.parent / plan["tasks"]["path"]
    assert (tasks / "dataset.toml").is_file()
    assert len([p for p in tasks.iterdir() if p.is_dir()]) >= 20


def test_a_plan_with_the_old_key_name_passes_with_a_warning_naming_file_section_and_key(
    tmp_path,
):
    text = PLAN.read_text(encoding="utf-8")
    assert 'model = "Qwen/Qwen3-8B"' in text
    plan = tmp_path / "plan.toml"
    plan.write_text(
        text.replace('model = "Qwen/Qwen3-8B"', 'base_model = "Qwen/Qwen3-8B"').replace(
            'path = "../tasks/shell"', f"path = {str(PLAN.parent.parent / 'tasks' / 'shell')!r}"
        ),
        encoding="utf-8",
    )
    resolved = plan_check(plan, cwd=REPO)
    components = {c["where"]: c for c in resolved["components"]}
    assert components["[trainer]"]["config"]["model"] == "Qwen/Qwen3-8B"
    (note,) = resolved["notes"]
    assert note.startswith(f"{plan}: [trainer]: base_model is the old name of model")
    assert "rename the key: model = 'Qwen/Qwen3-8B'" in note
    shown = run_cli("plan", "check", str(plan), cwd=REPO, columns=300)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "warning:" in shown.stderr and "base_model is the old name of model" in shown.stderr

    both = tmp_path / "both.toml"
    both.write_text(
        plan.read_text(encoding="utf-8").replace(
            'base_model = "Qwen/Qwen3-8B"', 'base_model = "Qwen/Qwen3-8B"\nmodel = "Qwen/Qwen3-8B"'
        ),
        encoding="utf-8",
    )
    refused = run_cli("plan", "check", str(both), cwd=REPO, columns=300)
    assert refused.returncode != 0
    assert "[trainer]" in refused.stderr + refused.stdout
    assert "both model and base_model are set" in refused.stderr + refused.stdout
