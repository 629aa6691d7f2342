"""``[gateway].workers``: 1 by default; above 1 a plan with a shared ``[sampler]`` (vLLM) passes,
and ``plan check`` (and so every run and evaluation, which resolve the plan before building
anything) refuses it at ``[gateway].workers``, naming why and what to do, for the trainer
backend's own sampler (it lives in the run's process), a sampler that is not shared, and a plan
with convertible nodes."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from rllm_core.cli import main
from rllm_core.errors import PlanError
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plan.schema import Plan
from rllm_core.plugins import PluginManager

VLLM = {"name": "vllm", "urls": ["http://127.0.0.1:8011"]}


def resolve(gateway: dict[str, Any], sampler: dict[str, Any] | None = None):
    data: dict[str, Any] = {
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"},
        "trainer": {"name": "torch", "model": "smollm2-135m-instruct"},
        "gateway": gateway,
    }
    if sampler is not None:
        data["sampler"] = sampler
    return resolve_plan(parse_plan(data), manager=PluginManager(), path="plan.toml")


def refusal(gateway: dict[str, Any], sampler: dict[str, Any] | None = None):
    with pytest.raises(PlanError) as caught:
        resolve(gateway, sampler)
    (issue,) = caught.value.issues
    return issue


def test_one_worker_is_the_default_and_passes_with_either_sampler():
    assert Plan.model_validate({}).gateway.workers == 1
    resolve({})
    resolve({"workers": 1})
    pytest.importorskip("rllm_sampler_vllm")
    resolve({"workers": 1}, VLLM)


def test_fewer_than_one_worker_is_refused_by_the_schema_naming_the_key():
    with pytest.raises(ValueError, match="workers"):
        Plan.model_validate({"gateway": {"workers": 0}})


def test_workers_with_the_trainers_in_process_sampler_are_refused_naming_it():
    issue = refusal({"workers": 2})
    assert (issue.section, issue.key, issue.value) == ("gateway", "workers", 2)
    assert "the sampler of trainer backend 'torch'" in issue.message
    assert "cannot be reached from other gateway processes" in issue.message
    assert issue.hint.startswith("set [gateway] workers = 1")
    assert "add a [sampler]" in issue.hint


def test_workers_with_a_vllm_sampler_pass():
    pytest.importorskip("rllm_sampler_vllm")
    resolved = resolve({"workers": 3}, VLLM)
    assert resolved.plan.gateway.workers == 3


def test_workers_with_a_sampler_that_is_not_shared_are_refused_naming_it():
    from rllm_core import ComponentSpec, hookimpl
    from rllm_core.plugins.specs import NoConfig

    class Plugin:
        @hookimpl
        def rllm_samplers(self):
            yield ComponentSpec(
                kind="sampler",
                name="private",
                factory=lambda config: None,
                config=NoConfig,
                summary="a sampler only its own process reaches",
            )

    manager = PluginManager()
    manager.register(Plugin(), name="private-sampler")
    data: dict[str, Any] = {
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"},
        "trainer": {"name": "torch", "model": "smollm2-135m-instruct"},
        "sampler": {"name": "private"},
        "gateway": {"workers": 2},
    }
    with pytest.raises(PlanError) as caught:
        resolve_plan(parse_plan(data), manager=manager, path="plan.toml")
    issues = [i for i in caught.value.issues if i.key == "workers"]
    (issue,) = issues
    assert "sampler 'private' offers no client for other processes" in issue.message
    assert issue.hint.startswith("set [gateway] workers = 1")


def test_workers_with_convertible_nodes_are_refused_saying_why():
    pytest.importorskip("rllm_sampler_vllm")
    sampler = {"name": "vllm", "urls": ["http://127.0.0.1:8011", "http://127.0.0.1:8012"]}
    data: dict[str, Any] = {
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"},
        "trainer": {"name": "torch", "model": "smollm2-135m-instruct"},
        "sampler": sampler,
        "gateway": {"workers": 2},
        "scheduler": {
            "nodes": [
                {"name": "a", "url": sampler["urls"][0], "class": "big"},
                {"name": "b", "url": sampler["urls"][1], "class": "big"},
            ],
            "node_classes": {"big": {}},
            "launcher": "local-process",
        },
    }
    with pytest.raises(PlanError) as caught:
        resolve_plan(parse_plan(data), manager=PluginManager(), path="plan.toml")
    issues = [i for i in caught.value.issues if i.key == "workers"]
    (issue,) = issues
    assert "cannot go with convertible nodes" in issue.message
    assert "remove [scheduler] nodes" in issue.hint


def test_plan_check_exits_2_naming_the_file_and_the_key(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[trainer]\nname = "torch"\nmodel = "smollm2-135m-instruct"\n[gateway]\nworkers = 2\n',
        encoding="utf-8",
    )
    done = CliRunner().invoke(main, ["plan", "check", str(plan)])
    assert done.exit_code == 2, done.output
    assert f"{plan}: [gateway].workers: [gateway] workers = 2" in done.output
    assert "set [gateway] workers = 1" in done.output
