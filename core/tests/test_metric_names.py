"""The metrics a run reduces are declared with their reductions, and the reductions follow
the declaration."""

from __future__ import annotations

import pytest
from rllm_core.run.metric_names import SUMMARY, PassRule, Reduction, pass_rule
from rllm_core.run.metrics import summarize
from rllm_core.training.update import merge_pass_metrics


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("tokens", PassRule(Reduction.SUM, first_epoch=True)),
        ("action_tokens", PassRule(Reduction.SUM, first_epoch=True)),
        ("tinker/dropped_overlong", PassRule(Reduction.SUM, first_epoch=True)),
        ("fireworks/skipped_step", PassRule(Reduction.SUM)),
        ("learning_rate", PassRule(Reduction.LAST)),
        ("offpolicy/ratio_max", PassRule(Reduction.MAX, first_epoch=True)),
        ("correction/weight", PassRule(Reduction.MEAN, first_epoch=True)),
        ("dppo-tv/ratio_min", PassRule(Reduction.MIN)),
        ("dppo-tv/loss", PassRule(Reduction.MEAN)),
    ],
)
def test_each_name_gets_the_first_rule_that_matches(name, rule):
    assert pass_rule(name) == rule


def test_the_merge_follows_the_rules():
    passes = [
        (0, {"action_tokens": 1.0, "x/loss": 1.0, "x/r_min": 3.0, "offpolicy/kl": 5.0}, {}),
        (1, {"action_tokens": 3.0, "x/loss": 3.0, "x/r_min": 2.0, "offpolicy/kl": 9.0}, {}),
    ]
    merged = merge_pass_metrics(passes)
    assert merged["action_tokens"] == 1.0  # the first epoch's count
    assert merged["x/loss"] == (1.0 * 1.0 + 3.0 * 3.0) / 4.0  # weighted by action tokens
    assert merged["x/r_min"] == 2.0
    assert merged["offpolicy/kl"] == 5.0  # first epoch only
    assert merged["optimizer_steps"] == 2.0


def test_the_summary_has_each_declared_key_reduced_as_declared():
    rows = [
        {"step": s, "reward/mean": float(s), "accuracy": s / 10, "episodes": 2.0}
        for s in range(1, 8)
    ]
    summary = summarize(rows, window=2)
    assert {key for key, _, _ in SUMMARY} <= set(summary)
    assert summary["reward_first"] == 1.5 and summary["reward_last"] == 6.5
    assert summary["accuracy_last"] == 0.7 and summary["episodes"] == 14.0
    assert summary["groups"] == 0.0 and summary["sampler_utilization"] is None
