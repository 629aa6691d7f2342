"""The termination reasons a plan may mask, how the plan's mask and verifier-timeout cap reach
the rollout settings, and each step's ``termination/<reason>`` rates."""

from __future__ import annotations

import pytest
from rllm_core.errors import PlanError
from rllm_core.plan import parse_plan
from rllm_core.rollout.context import rollout_settings
from rllm_core.run.metrics import rollout_metrics
from rllm_core.types import DEFAULT_MASK, Episode, Termination

KNOWN = (
    "sandbox_error, verifier_error, environment_start_timeout, agent_setup_timeout,"
    " verifier_timeout, grading_error, no_model_call"
)


@pytest.mark.parametrize(
    ("reason", "why"),
    [("verifier_timout", "is unknown"), ("max_turns", "is the policy's own reason")],
)
def test_plan_check_refuses_a_reason_it_cannot_mask_listing_the_known_ones(reason, why):
    with pytest.raises(PlanError) as info:
        parse_plan({"rollout": {"mask": ["sandbox_error", reason]}})
    (issue,) = info.value.issues
    assert issue.location == "[rollout].mask"
    assert f"{reason!r} {why}" in str(issue)
    assert f"a mask names any of {KNOWN}" in str(issue)


def test_the_plans_mask_and_cap_reach_the_rollout_settings():
    default = rollout_settings(parse_plan({}), group_size=2)
    assert default.mask == DEFAULT_MASK and default.max_verifier_timeouts is None
    assert {str(r) for r in DEFAULT_MASK} == set(KNOWN.split(", "))
    plan = parse_plan(
        {"rollout": {"mask": ["sandbox_error", "sandbox_error"], "max_verifier_timeouts": 3}}
    )
    settings = rollout_settings(plan, group_size=2)
    assert settings.mask == {Termination.SANDBOX_ERROR} and settings.max_verifier_timeouts == 3
    assert plan.rollout.mask == ["sandbox_error"]


def episode(termination: Termination) -> Episode:
    return Episode(
        episode_id="e",
        task_id="t",
        group_id="g",
        session_id="e",
        trajectories=(),
        reward=0.0,
        termination=termination,
    )


def test_each_reason_gets_its_share_of_the_steps_rollouts_excluded_ones_included():
    line = rollout_metrics(
        episodes=[episode(Termination.DONE), episode(Termination.DONE)],
        infra_failures=2,
        excluded=[Termination.NO_MODEL_CALL, Termination.VERIFIER_TIMEOUT],
        retries=0,
        report={},
        rollout_s=1.0,
    )
    rates = {k: v for k, v in line.items() if k.startswith("termination/")}
    assert set(rates) == {f"termination/{reason}" for reason in Termination}
    assert rates["termination/done"] == 0.5
    assert rates["termination/no_model_call"] == rates["termination/verifier_timeout"] == 0.25
    assert sum(rates.values()) == 1.0
    empty = rollout_metrics(episodes=[], infra_failures=0, retries=0, report={}, rollout_s=1.0)
    assert all(empty[f"termination/{reason}"] == 0.0 for reason in Termination)
