"""A loss that pins its aggregation (its config's ``pinned_aggregation()``): the run reduces
with the pinned mode when ``[algorithm].aggregation`` is unset, and ``plan check`` refuses a
plan that sets another, two losses that pin different modes, a pin the core does not have,
and a pin to the norm mode without ``norm_length``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from rllm_core import ComponentSpec, hookimpl
from rllm_core.errors import PlanError, PlanIssue
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import ResolvedPlan, resolve_plan
from rllm_core.plugins import PluginManager
from rllm_core.training.update import build_objective


class PinConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pin: str | None = "seq-mean-token-sum"
    coef: float = 1.0

    def pinned_aggregation(self) -> str | None:
        return self.pin


class FreeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Losses:
    @hookimpl
    def rllm_losses(self):
        yield ComponentSpec(
            kind="loss", name="pinned", factory=lambda c: object(), config=PinConfig, summary="p"
        )
        yield ComponentSpec(
            kind="loss", name="free", factory=lambda c: object(), config=FreeConfig, summary="f"
        )
        yield ComponentSpec(
            kind="loss",
            name="pinned-aux",
            factory=lambda c: object(),
            config=PinConfig,
            summary="a",
            traits={"role": "auxiliary"},
        )


@pytest.fixture(scope="module")
def manager() -> PluginManager:
    manager = PluginManager(load_entry_points=False)
    manager.register(Losses(), name="pin-test")
    return manager


def resolve(manager: PluginManager, **algorithm: Any) -> ResolvedPlan:
    data = {"algorithm": {"loss": "pinned"} | algorithm}
    return resolve_plan(parse_plan(data), manager=manager, path="plan.toml")


def refused(manager: PluginManager, **algorithm: Any) -> PlanIssue:
    with pytest.raises(PlanError) as caught:
        resolve(manager, **algorithm)
    (issue,) = caught.value.issues
    return issue


def objective_mode(resolved: ResolvedPlan) -> str:
    aux = [(object(), c.coef) for c in resolved if c.where.startswith("[algorithm].aux_losses")]
    return build_objective(resolved, object(), aux).aggregation


def test_an_unset_aggregation_takes_the_pinned_mode_with_a_note(manager):
    resolved = resolve(manager)
    assert objective_mode(resolved) == "seq-mean-token-sum"
    (note,) = resolved.notes
    assert (
        "plan.toml" in note and "'pinned'" in note and 'aggregation = "seq-mean-token-sum"' in note
    )


def test_a_plan_naming_the_pinned_mode_passes_without_a_note(manager):
    resolved = resolve(manager, aggregation="seq-mean-token-sum")
    assert objective_mode(resolved) == "seq-mean-token-sum" and resolved.notes == ()


def test_a_loss_without_a_pin_leaves_the_plans_mode(manager):
    resolved = resolve(manager, loss={"name": "pinned", "pin": None})
    assert objective_mode(resolved) == "token-mean" and resolved.notes == ()
    assert objective_mode(resolve(manager, loss="free")) == "token-mean"


def test_a_plan_naming_another_mode_is_refused(manager):
    issue = refused(manager, aggregation="token-mean")
    assert (issue.section, issue.key, issue.value) == ("algorithm", "aggregation", "token-mean")
    assert "'pinned' ([algorithm].loss) pins the aggregation 'seq-mean-token-sum'" in issue.message
    assert issue.hint is not None and 'aggregation = "seq-mean-token-sum"' in issue.hint


def test_two_losses_pinning_different_modes_are_refused(manager):
    aux = [{"name": "pinned-aux", "coef": 0.5, "pin": "seq-mean-token-mean"}]
    issue = refused(manager, aux_losses=aux)
    assert issue.key == "aggregation" and issue.value == "seq-mean-token-mean"
    assert "'pinned-aux' ([algorithm].aux_losses[0])" in issue.message
    assert "'pinned' ([algorithm].loss) pins 'seq-mean-token-sum'" in issue.message
    # An auxiliary loss left out by a zero coefficient pins nothing.
    resolved = resolve(manager, aux_losses=[aux[0] | {"coef": 0.0}])
    assert objective_mode(resolved) == "seq-mean-token-sum"


def test_a_pin_the_core_does_not_have_is_refused(manager):
    issue = refused(manager, loss={"name": "pinned", "pin": "token-sum"})
    assert (issue.key, issue.value) == ("loss", "token-sum")
    assert "'pinned' pins the aggregation mode 'token-sum'" in issue.message


def test_a_pin_to_the_norm_mode_needs_a_norm_length(manager):
    issue = refused(manager, loss={"name": "pinned", "pin": "seq-mean-token-sum-norm"})
    assert (issue.section, issue.key) == ("algorithm", "norm_length")
    resolved = resolve(
        manager, loss={"name": "pinned", "pin": "seq-mean-token-sum-norm"}, norm_length=64
    )
    assert objective_mode(resolved) == "seq-mean-token-sum-norm"
