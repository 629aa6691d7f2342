"""plan.toml: schema validation, located errors, overrides and resolution."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field
from rllm_core import (
    ComponentSpec,
    hookimpl,
)
from rllm_core.errors import PlanError
from rllm_core.plan import apply_overrides, load_plan, parse_plan, resolve_plan


class DeltaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delta: float = Field(0.15, gt=0)


class CoefConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    coef: float = 0.05


class Components:
    @hookimpl
    def rllm_losses(self):
        yield ComponentSpec(
            kind="loss", name="dppo-tv", factory=dict, config=DeltaConfig, summary="policy"
        )
        yield ComponentSpec(
            kind="loss",
            name="echo",
            factory=dict,
            config=CoefConfig,
            summary="aux",
            traits={"role": "auxiliary"},
        )
        yield ComponentSpec(
            kind="loss",
            name="plain-aux",
            factory=dict,
            summary="aux without coef",
            traits={"role": "auxiliary"},
        )

    @hookimpl
    def rllm_renderers(self):
        yield ComponentSpec(kind="renderer", name="chatml", factory=dict, summary="renderer")


@pytest.fixture
def components(register_plugin):
    return register_plugin(Components(), name="components", distribution="rllm-test-components")


def issues(exc: pytest.ExceptionInfo[PlanError]) -> list[str]:
    return [str(i) for i in exc.value.issues]


def test_defaults_validate():
    plan = parse_plan({})
    assert plan.run.steps == 10
    assert plan.algorithm.aggregation == "token-mean"
    assert plan.trainer is None


def test_unknown_loss_names_file_key_choices_and_closest(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"loss": "dppo_tvv"}})
    (only,) = info.value.issues
    assert only.location == "[algorithm].loss"
    text = str(only)
    assert text.startswith(str(plan_builder.folder / "plan-1.toml"))
    assert "'dppo_tvv'" in text
    assert "did you mean 'dppo-tv'?" in text
    assert "available: dppo-tv, echo, plain-aux" in text


def test_unknown_key_in_component_lists_valid_keys(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"loss": {"name": "dppo-tv", "detla": 0.2}}})
    (only,) = info.value.issues
    assert only.location == "[algorithm].loss.detla"
    assert "loss 'dppo-tv' has no key 'detla'; did you mean 'delta'?" in str(only)
    assert "valid keys: delta" in str(only)


def test_bad_component_value_is_located(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"renderer": {"name": "chatml", "x": 1}})
    assert issues(info)[0].endswith(
        "[renderer].x: renderer 'chatml' has no key 'x'; renderer 'chatml' takes no keys"
    )
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"loss": {"name": "dppo-tv", "delta": -1}}})
    assert (
        "[algorithm].loss.delta: loss 'dppo-tv': Input should be greater than 0" in issues(info)[0]
    )


def test_unknown_section_and_key_suggest(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorthm": {}, "run": {"sede": 1}})
    text = "\n".join(issues(info))
    assert "[algorthm]: unknown section [algorthm]; did you mean [algorithm]?" in text
    assert "[run].sede: unknown key 'sede'; did you mean 'seed'?" in text


def test_every_problem_is_reported_at_once(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {"algorithm": {"loss": "nope", "advantage": "grpo"}, "renderer": "chatm"}
        )
    locations = [i.location for i in info.value.issues]
    assert locations == ["[algorithm].loss", "[algorithm].advantage", "[renderer].name"]
    assert "pip install rllm-advantage-estimator-grpo" in str(info.value.issues[1])


def test_aux_losses_take_coefficients(plan_builder, components):
    resolved = plan_builder.resolve(
        {
            "algorithm": {
                "loss": "dppo-tv",
                "aux_losses": [
                    {"name": "echo"},
                    {"name": "plain-aux", "coef": 0.5},
                    {"name": "echo", "coef": 0.0},
                ],
            }
        }
    )
    coefs = [c.coef for c in resolved if c.spec.trait("role") == "auxiliary"]
    assert coefs == [0.05, 0.5, 0.0]


def test_aux_loss_without_coef_and_role_mixups(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {
                "algorithm": {
                    "loss": "echo",
                    "aux_losses": [{"name": "plain-aux"}, {"name": "dppo-tv", "coef": 1}],
                }
            }
        )
    text = issues(info)
    assert "[algorithm].loss: loss 'echo' is an auxiliary loss, not a policy one" in text[0]
    assert (
        "[algorithm].aux_losses[0].coef: auxiliary loss 'plain-aux' needs a coefficient"
        in (text[1])
    )
    assert "loss 'dppo-tv' is a policy loss, not an auxiliary one" in text[2]


def test_overrides_set_and_convert_bare_names():
    data = {"algorithm": {"loss": "dppo-tv"}, "run": {"steps": 3}}
    apply_overrides(
        data,
        ["run.steps=20", "algorithm.loss.delta=0.2", "run.name=fast run", "sampling.top_p=0.9"],
        path="p.toml",
    )
    assert data == {
        "algorithm": {"loss": {"name": "dppo-tv", "delta": 0.2}},
        "run": {"steps": 20, "name": "fast run"},
        "sampling": {"top_p": 0.9},
    }


def test_malformed_override_is_a_plan_error():
    with pytest.raises(PlanError, match=r"is not of the form section\.key=value"):
        apply_overrides({}, ["steps"], path="p.toml")
    with pytest.raises(PlanError, match="is a value, not a table"):
        apply_overrides({"run": {"steps": 1}}, ["run.steps.x=1"], path="p.toml")


def test_override_values_are_validated_like_file_values(plan_builder, components):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"run": {"steps": 3}}, overrides=["run.steps=zero"])
    assert "[run].steps: Input should be a valid integer" in issues(info)[0]


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(PlanError, match="plan file not found"):
        load_plan(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nsteps = 1\n")
    with pytest.raises(PlanError, match=r"bad.toml: \(top level\): invalid TOML"):
        load_plan(bad)


def test_norm_length_required_for_sum_norm():
    with pytest.raises(PlanError, match="needs norm_length"):
        parse_plan({"algorithm": {"aggregation": "seq-mean-token-sum-norm"}})
    plan = parse_plan({"algorithm": {"aggregation": "seq-mean-token-sum-norm", "norm_length": 512}})
    assert plan.algorithm.norm_length == 512


def test_resolved_plan_builds_components(plan_builder, components):
    resolved = plan_builder.resolve({"algorithm": {"loss": {"name": "dppo-tv", "delta": 0.3}}})
    loss = resolved.get("[algorithm].loss")
    assert loss.provider == "rllm-test-components 0+test"
    assert loss.config.delta == 0.3
    assert resolved.to_dict()["components"][0]["config"] == {"delta": 0.3}


def test_resolution_against_an_explicit_manager(plugin_manager, components):
    plan = parse_plan({"renderer": {"name": "chatml"}})
    assert resolve_plan(plan, manager=plugin_manager).get("[renderer]").name == "chatml"


# ---------------------------------------------------------------- keys a run would not use


class Trainers:
    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend", name="remote", factory=dict, summary="rollout logprobs only"
        )
        yield ComponentSpec(
            kind="trainer_backend",
            name="local",
            factory=dict,
            summary="recomputes logprobs",
            traits={"proximal_modes": ("rollout", "recompute")},
        )
        yield ComponentSpec(
            kind="trainer_backend",
            name="publishing",
            factory=dict,
            summary="publishes weights while sampling",
            traits={"publishes_weights": True},
        )


@pytest.fixture
def trainers(register_plugin):
    return register_plugin(Trainers(), name="trainers", distribution="rllm-test-trainers")


def test_a_policy_age_bound_is_refused_in_sync_mode_naming_the_key(plan_builder):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"max_policy_age": 2}})
    (only,) = info.value.issues
    assert only.location == "[algorithm].max_policy_age"
    assert "no pipeline reads a policy-age bound" in str(only)
    assert 'set [run].pipeline = "async" or remove the key' in str(only)


@pytest.fixture
def stores(register_plugin):
    class Stores:
        @hookimpl
        def rllm_sample_buffers(self):
            yield ComponentSpec(kind="sample_buffer", name="file", factory=dict, summary="buffer")

        @hookimpl
        def rllm_object_stores(self):
            yield ComponentSpec(kind="object_store", name="file", factory=dict, summary="objects")

    return register_plugin(Stores(), name="stores", distribution="rllm-test-stores")


def test_an_object_store_is_refused_in_sync_mode_and_used_in_async(plan_builder, stores, trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"object_store": {"name": "file"}})
    (only,) = info.value.issues
    assert only.location == "[object_store]"
    assert "a sync run keeps everything in its run folder" in str(only)
    resolved = plan_builder.resolve(
        {
            "run": {"pipeline": "async"},
            "algorithm": {"max_policy_age": 1},
            "trainer": "publishing",
            "object_store": {"name": "file"},
        }
    )
    assert resolved.get("[object_store]").name == "file"


def test_an_object_store_holds_the_buffer_so_a_second_buffer_is_refused(
    plan_builder, stores, trainers
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {
                "run": {"pipeline": "async"},
                "algorithm": {"max_policy_age": 1},
                "trainer": "publishing",
                "object_store": {"name": "file"},
                "sample_buffer": {"name": "file"},
            }
        )
    (only,) = info.value.issues
    assert only.location == "[sample_buffer].name"
    assert "the sample buffer lives in it" in str(only)
    assert 'it defaults to "object-store"' in str(only)


def test_the_object_store_buffer_without_an_object_store_is_refused(plan_builder, trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {
                "run": {"pipeline": "async"},
                "algorithm": {"max_policy_age": 1},
                "trainer": "publishing",
                "sample_buffer": {"name": "object-store"},
            }
        )
    messages = [str(i) for i in info.value.issues if i.location == "[sample_buffer].name"]
    assert any("keeps its samples in the plan's object store" in m for m in messages), messages


def test_scheduler_keys_need_an_object_store(plan_builder, stores, trainers):
    async_plan = {
        "run": {"pipeline": "async"},
        "algorithm": {"max_policy_age": 1},
        "trainer": "publishing",
    }
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(async_plan | {"scheduler": {"max_failures": 5}})
    (only,) = info.value.issues
    assert only.location == "[scheduler].max_failures"
    assert "--role trainer" in str(only)
    resolved = plan_builder.resolve(
        async_plan | {"scheduler": {"max_failures": 5}, "object_store": {"name": "file"}}
    )
    assert resolved.plan.scheduler.max_failures == 5


def test_a_sample_buffer_is_refused_in_sync_mode_and_used_in_async(plan_builder, stores, trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"sample_buffer": {"name": "file"}})
    (only,) = info.value.issues
    assert only.location == "[sample_buffer]"
    assert "only the async pipeline queues them in a buffer" in str(only)
    resolved = plan_builder.resolve(
        {
            "run": {"pipeline": "async"},
            "algorithm": {"max_policy_age": 1},
            "trainer": "publishing",
            "sample_buffer": {"name": "file"},
        }
    )
    assert resolved.get("[sample_buffer]").name == "file"


@pytest.mark.parametrize(
    ("algorithm", "least"),
    [
        ({}, 1),
        ({"max_policy_age": 0}, 1),
        ({"max_policy_age": 3, "mini_batches": 2, "epochs": 2}, 4),
    ],
)
def test_async_needs_a_bound_covering_the_versions_of_a_step(
    plan_builder, trainers, algorithm, least
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {"run": {"pipeline": "async"}, "algorithm": algorithm, "trainer": "publishing"}
        )
    (only,) = info.value.issues
    assert only.location == "[algorithm].max_policy_age"
    assert f"needs max_policy_age >= {least}" in str(only)
    assert f"set [algorithm].max_policy_age to {least} or more" in str(only)


def test_async_is_refused_for_a_trainer_that_cannot_publish_weights(plan_builder, trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {"run": {"pipeline": "async"}, "algorithm": {"max_policy_age": 1}, "trainer": "remote"}
        )
    (only,) = info.value.issues
    assert only.location == "[trainer].name"
    assert "trainer backend 'remote' cannot publish weights" in str(only)
    assert 'use [run].pipeline = "sync"' in str(only)


def test_recompute_is_refused_for_a_trainer_that_cannot_honour_it(plan_builder, trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"proximal": "recompute"}, "trainer": "remote"})
    (only,) = info.value.issues
    assert only.location == "[algorithm].proximal"
    assert "trainer backend 'remote' cannot honour proximal = 'recompute'" in str(only)
    resolved = plan_builder.resolve({"algorithm": {"proximal": "recompute"}, "trainer": "local"})
    assert resolved.plan.algorithm.proximal == "recompute"


def test_fidelity_keys_validate_with_located_errors(plan_builder):
    plan = parse_plan(
        {
            "algorithm": {
                "epochs": 2,
                "mini_batches": 4,
                "correction": {"tis_cap": 2.0, "mask_low": 0.5, "mask_high": 2.0},
            }
        }
    )
    assert (plan.algorithm.epochs, plan.algorithm.mini_batches) == (2, 4)
    assert plan.algorithm.correction.tis_cap == 2.0
    with pytest.raises(PlanError) as info:
        plan_builder.resolve({"algorithm": {"correction": {"mask_low": 0.5}}})
    assert "set both mask_low and mask_high" in str(info.value)


def test_a_start_threshold_given_both_in_groups_and_as_alpha_is_refused(
    plan_builder, stores, trainers
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {
                "run": {"pipeline": "async"},
                "algorithm": {"max_policy_age": 1, "batch_size": 2},
                "trainer": "publishing",
                "object_store": {"name": "file"},
                "scheduler": {"q_on_groups": 4, "alpha": 0.5},
            }
        )
    (only,) = info.value.issues
    assert only.location == "[scheduler].alpha"
    assert "keep one" in str(only)


def test_a_trainer_start_threshold_the_age_bound_never_lets_wait_is_refused(
    plan_builder, stores, trainers
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {
                "run": {"pipeline": "async"},
                "algorithm": {"max_policy_age": 1, "batch_size": 2},
                "trainer": "publishing",
                "object_store": {"name": "file"},
                "scheduler": {"q_on_groups": 5},
            }
        )
    (only,) = info.value.issues
    assert only.location == "[scheduler].q_on_groups"
    assert "it would never start" in str(only) and "between 2 and 4" in str(only)
