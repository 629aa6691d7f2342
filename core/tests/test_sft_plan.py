"""The ``[sft]`` plan section: its own validation, what plan check refuses around it, and
``rllm-core run`` refusing an SFT plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference.cli_process import run_cli
from rllm_core import ComponentSpec, hookimpl
from rllm_core.errors import PlanError
from rllm_core.plan.schema import Plan


class Parts:
    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend",
            name="packing",
            factory=dict,
            summary="packs and exports",
            traits={"packs_sequences": True, "exports_weights": True},
        )
        yield ComponentSpec(kind="trainer_backend", name="plain", factory=dict, summary="plain")

    @hookimpl
    def rllm_renderers(self):
        yield ComponentSpec(kind="renderer", name="r", factory=dict, summary="renderer")

    @hookimpl
    def rllm_task_sources(self):
        yield ComponentSpec(kind="task_source", name="t", factory=dict, summary="tasks")


@pytest.fixture
def parts(register_plugin):
    return register_plugin(Parts(), name="parts", distribution="rllm-test-sft-parts")


def sft_plan(folder: Path, **sft) -> dict:
    data = folder / "train.jsonl"
    data.write_text("{}\n")
    return {"sft": {"data": "train.jsonl", **sft}, "trainer": "packing", "renderer": "r"}


def issues(plan_builder, data) -> list[str]:
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(data)
    return [str(issue) for issue in info.value.issues]


def test_an_sft_plan_resolves_with_its_paths_relative_to_the_plan(plan_builder, parts, tmp_path):
    resolved = plan_builder.resolve(sft_plan(plan_builder.folder, packing=True, max_length=64))
    assert resolved.plan.is_sft
    assert resolved.plan.sft.data == str(plan_builder.folder / "train.jsonl")
    assert resolved.to_dict()["plan"]["sft"]["packing"] is True


def test_an_rl_plan_is_no_sft_plan_and_its_dump_has_no_sft_table(plan_builder, parts):
    resolved = plan_builder.resolve({"trainer": "plain", "renderer": "r"})
    assert not resolved.plan.is_sft
    assert "sft" not in resolved.to_dict()["plan"]


@pytest.mark.parametrize(
    ("sft", "expected"),
    [
        ({"from_run": "runs/x"}, "set data or from_run, not both"),
        ({"min_reward": 1.0}, "min_reward filters the episodes of from_run"),
        ({"eval_data": "e.jsonl", "eval_fraction": 0.1}, "set eval_data or eval_fraction"),
        ({"packing": True}, "packing fills rows of max_length tokens; set max_length"),
        ({"overlong": "drop"}, "overlong says what becomes of examples longer than max_length"),
        ({"max_length": 64, "overlong": "cut"}, "overlong"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"batch_size": 0}, "batch_size"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_the_section_refuses_contradictions(plan_builder, parts, tmp_path, sft, expected):
    found = issues(plan_builder, sft_plan(plan_builder.folder, **sft))
    assert any(expected in text and "[sft]" in text for text in found), found


def test_plan_check_refuses_what_an_sft_run_would_not_use_or_cannot_do(
    plan_builder, parts, tmp_path
):
    data = sft_plan(plan_builder.folder, packing=True, max_length=64, export="out")
    data |= {
        "trainer": "plain",
        "tasks": "t",
        "algorithm": {"batch_size": 2},
        "run": {"steps": 3, "export": "rl-out"},
    }
    data["sft"]["eval_data"] = "missing.jsonl"
    found = issues(plan_builder, data)
    expected = [
        "[algorithm]: [algorithm] belongs to RL runs",
        "[tasks]: [tasks] belongs to RL runs",
        "[run].steps: an SFT run's length is [sft].epochs",
        "[run].export: an SFT run exports with [sft].export",
        "[sft].eval_data: no such file or folder",
        "[sft].packing: trainer backend 'plain' cannot pack",
        "[sft].export: trainer backend 'plain' cannot export",
    ]
    for part in expected:
        assert any(part in text for text in found), (part, found)
    assert len(found) == len(expected)


def test_plan_check_wants_data_or_a_run_folder(plan_builder, parts, tmp_path):
    found = issues(plan_builder, {"sft": {}, "trainer": "packing", "renderer": "r"})
    assert any("[sft].data: no examples" in text for text in found), found
    (tmp_path / "notarun").mkdir()
    found = issues(
        plan_builder, {"sft": {"from_run": str(tmp_path / "notarun")}, "trainer": "packing"}
    )
    assert any("[sft].from_run" in text and "not a run folder" in text for text in found)
    assert any("[renderer].name: an SFT run needs it" in text for text in found)


def test_rllm_core_run_refuses_an_sft_plan_pointing_to_sft(tmp_path):
    (tmp_path / "train.jsonl").write_text("{}\n")
    plan = tmp_path / "sft.toml"
    plan.write_text('[sft]\ndata = "train.jsonl"\n[trainer]\nname = "torch"\nmodel = "."\n')
    done = run_cli("run", str(plan), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"rllm-core sft {plan}" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_rllm_core_sft_refuses_a_plan_without_sft(tmp_path):
    plan = tmp_path / "rl.toml"
    plan.write_text('[trainer]\nname = "torch"\n')
    done = run_cli("sft", str(plan), cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert "has no [sft] section" in done.stderr and "rllm-core run" in done.stderr


def test_section_defaults() -> None:
    sft = Plan.model_validate({"sft": {"data": "a.jsonl"}}).sft
    assert (sft.epochs, sft.batch_size, sft.packing, sft.format) == (1, 8, False, "auto")


def test_plan_check_refuses_an_rl_export_the_trainer_cannot_write(plan_builder, parts):
    data = {"trainer": "plain", "renderer": "r", "tasks": "t", "run": {"export": "out"}}
    found = issues(plan_builder, data)
    assert any(
        "[run].export" in text and "trainer backend 'plain' cannot export" in text for text in found
    ), found
    data["trainer"] = "packing"
    resolved = plan_builder.resolve(data)
    assert resolved.plan.run.export == str(plan_builder.folder / "out")
