"""Relative paths in a plan are relative to the plan file's folder, whatever the working
directory; ``--set`` values are relative to the working directory; absolute paths, ``~`` and
URLs stay as written; a key that takes a name or a folder is a path only when it looks like
one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import pytest
import tomli_w
from pydantic import BaseModel, ConfigDict
from reference.cli_process import plan_check
from rllm_core import ComponentSpec, PlanPath, hookimpl
from rllm_core.plan.load import load_plan
from rllm_core.plan.resolve import resolve_plan


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TasksConfig(_Config):
    path: Path
    eval_path: Path | None = None
    splits: dict[str, Path] = {}
    extra: list[Path] = []
    split_field: str | None = None


class Cache(_Config):
    folder: Path | None = None


class TrainerConfig(_Config):
    model: Annotated[str, PlanPath(or_name=True)] = "smollm2-135m-instruct"
    cache: Cache = Cache()


class RendererConfig(_Config):
    tokenizer: Annotated[str, PlanPath()]
    template: str = "auto"


class StoreConfig(_Config):
    path: Path


class LoggerConfig(_Config):
    dir: Path | None = None
    uri: str | None = None


class Components:
    @hookimpl
    def rllm_task_sources(self):
        yield ComponentSpec(
            kind="task_source", name="files", factory=dict, config=TasksConfig, summary="tasks"
        )

    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend", name="local", factory=dict, config=TrainerConfig, summary="t"
        )

    @hookimpl
    def rllm_renderers(self):
        yield ComponentSpec(
            kind="renderer", name="tok", factory=dict, config=RendererConfig, summary="renderer"
        )

    @hookimpl
    def rllm_trace_stores(self):
        yield ComponentSpec(
            kind="trace_store", name="dir", factory=dict, config=StoreConfig, summary="store"
        )

    @hookimpl
    def rllm_loggers(self):
        yield ComponentSpec(
            kind="logger", name="files", factory=dict, config=LoggerConfig, summary="logger"
        )


@pytest.fixture
def project(tmp_path, register_plugin, monkeypatch) -> Path:
    """``<tmp>/project`` for the plan; the working directory is ``<tmp>/elsewhere``."""
    register_plugin(Components(), name="components", distribution="rllm-test-components")
    (tmp_path / "project").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path / "project"


def _write(folder: Path, data: dict) -> Path:
    path = folder / "plan.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def _configs(path: Path, overrides=()) -> tuple[dict, dict]:
    plan, _ = load_plan(path, overrides)
    resolved = resolve_plan(plan, path=str(path))
    configs = {c.where: c.config.model_dump(mode="json") for c in resolved}
    return plan.model_dump(mode="json"), configs


def test_relative_paths_resolve_against_the_plan_folder_from_another_directory(project):
    path = _write(
        project,
        {
            "run": {"output_dir": "runs"},
            "tasks": {
                "name": "files",
                "path": "tasks/arith.jsonl",
                "eval_path": "../shared/eval.jsonl",
                "splits": {"hard": "./hard"},
                "extra": ["a.jsonl", "/abs/b.jsonl"],
                "split_field": "split",
            },
            "trainer": {"name": "local", "model": "./my-model", "cache": {"folder": "cache"}},
            "renderer": {"name": "tok", "tokenizer": "tokenizers/qwen3"},
            "trace_store": {"name": "dir", "path": "traces"},
            "loggers": [{"name": "files", "dir": "logs", "uri": "relative/uri"}],
        },
    )
    plan, configs = _configs(Path(os.path.relpath(path)))
    assert plan["run"]["output_dir"] == str(project / "runs")
    tasks = configs["[tasks]"]
    assert tasks["path"] == str(project / "tasks" / "arith.jsonl")
    assert tasks["eval_path"] == str(project.parent / "shared" / "eval.jsonl")
    assert tasks["splits"] == {"hard": str(project / "hard")}
    assert tasks["extra"] == [str(project / "a.jsonl"), "/abs/b.jsonl"]
    assert tasks["split_field"] == "split"
    assert configs["[trainer]"]["model"] == str(project / "my-model")
    assert configs["[trainer]"]["cache"]["folder"] == str(project / "cache")
    assert configs["[renderer]"]["tokenizer"] == str(project / "tokenizers" / "qwen3")
    assert configs["[trace_store]"]["path"] == str(project / "traces")
    assert configs["[loggers[0]]"] == {"dir": str(project / "logs"), "uri": "relative/uri"}


def test_absolute_home_and_url_values_stay_as_written(project):
    path = _write(
        project,
        {
            "run": {"output_dir": "~/runs"},
            "tasks": {"name": "files", "path": "/data/tasks.jsonl", "eval_path": "~/eval.jsonl"},
            "renderer": {"name": "tok", "tokenizer": "s3://bucket/tokenizer"},
        },
    )
    plan, configs = _configs(path)
    assert plan["run"]["output_dir"] == "~/runs"
    assert configs["[tasks]"]["path"] == "/data/tasks.jsonl"
    assert configs["[tasks]"]["eval_path"] == "~/eval.jsonl"
    assert configs["[renderer]"]["tokenizer"] == "s3://bucket/tokenizer"


@pytest.mark.parametrize(
    ("model", "resolved"),
    [
        ("smollm2-135m-instruct", "smollm2-135m-instruct"),
        ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M"),
        ("./smollm2-135m-instruct", "{project}/smollm2-135m-instruct"),
        ("../models/m", "{parent}/models/m"),
        ("local-model", "local-model"),
        ("org/local", "{project}/org/local"),
    ],
)
def test_a_name_or_folder_key_is_a_path_only_when_it_looks_like_one(project, model, resolved):
    """A bare word is a name even when the plan's folder has a folder of that name (known
    names win over folders: ``./name`` means the folder); ``org/name`` is a Hub id unless the
    plan's folder holds it."""
    (project / "local-model").mkdir()
    (project / "org" / "local").mkdir(parents=True)
    path = _write(project, {"trainer": {"name": "local", "model": model}})
    _, configs = _configs(path)
    expected = resolved.format(project=project, parent=project.parent)
    assert configs["[trainer]"]["model"] == expected


def test_a_default_is_not_a_path_of_the_plan(project):
    path = _write(project, {"tasks": {"name": "files", "path": "t.jsonl"}})
    plan, _ = _configs(path)
    assert plan["run"]["output_dir"] == "runs"


def test_set_values_are_relative_to_the_working_directory(project):
    path = _write(
        project,
        {
            "run": {"output_dir": "runs"},
            "tasks": {"name": "files", "path": "tasks/arith.jsonl"},
            "trace_store": {"name": "dir", "path": "traces"},
            "trainer": {"name": "local", "model": "./there"},
        },
    )
    cwd = Path.cwd()
    plan, configs = _configs(
        path,
        [
            "run.output_dir=out",
            "tasks.eval_path=eval.jsonl",
            "trace_store.path=mine",
            "trainer.model=./here",
        ],
    )
    assert plan["run"]["output_dir"] == str(cwd / "out")
    assert configs["[tasks]"]["path"] == str(project / "tasks" / "arith.jsonl")
    assert configs["[tasks]"]["eval_path"] == str(cwd / "eval.jsonl")
    assert configs["[trace_store]"]["path"] == str(cwd / "mine")
    assert configs["[trainer]"]["model"] == str(cwd / "here")


def test_an_unknown_component_keeps_its_keys_for_resolution_to_report(project):
    path = _write(project, {"tasks": {"name": "nope", "path": "t.jsonl"}})
    _, data = load_plan(path)
    assert data["tasks"] == {"name": "nope", "path": "t.jsonl"}


def test_plan_check_from_another_directory_prints_paths_in_the_plan_folder(tmp_path):
    pytest.importorskip("rllm_task_source_jsonl")
    pytest.importorskip("rllm_trace_store_deltachain")
    project = tmp_path / "project"
    (project / "tasks").mkdir(parents=True)
    (project / "tasks" / "arith.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    plan = _write(
        project,
        {
            "run": {"output_dir": "out"},
            "tasks": {"name": "jsonl", "path": "tasks/arith.jsonl"},
            "trace_store": {"name": "deltachain", "path": "traces"},
        },
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resolved = plan_check(plan, cwd=elsewhere)
    components = {c["where"]: c["config"] for c in resolved["components"]}
    assert resolved["plan"]["run"]["output_dir"] == str(project / "out")
    assert components["[tasks]"]["path"] == str(project / "tasks" / "arith.jsonl")
    assert components["[trace_store]"]["path"] == str(project / "traces")
