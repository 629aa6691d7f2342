"""Loss metric names and the mask-aware aggregate the trainer backends share."""

from __future__ import annotations

import pytest
import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate
from rllm_core.algorithms.naming import loss_name, unique_names


class Named:
    name = "my-loss"


class DoubleClipLoss:
    pass


def test_a_name_attribute_wins():
    assert loss_name(Named()) == "my-loss"


def test_an_unregistered_class_is_named_in_kebab_case():
    assert loss_name(DoubleClipLoss()) == "double-clip-loss"


def test_repeated_names_get_suffixes():
    assert unique_names(["dppo-tv", "echo", "echo", "echo"]) == [
        "dppo-tv",
        "echo",
        "echo-2",
        "echo-3",
    ]


def test_the_aggregate_picks_the_normalizers_of_the_mask_it_is_given():
    action = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    observation = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    aggregate = MaskAwareAggregate(
        action=make_aggregate("token-mean", total_tokens=3, total_sequences=2),
        observation=make_aggregate("token-mean", total_tokens=4, total_sequences=2),
        action_mask=action,
        observation_mask=observation,
    )
    values = torch.arange(8.0).reshape(2, 4)
    # action tokens 1 + 2 + 5 = 8 over the action total 3; observation tokens 3 + 6 + 7 = 16
    # over the observation total 4, also for a copy selecting the same tokens
    assert aggregate(values, action).item() == pytest.approx(8 / 3)
    assert aggregate(values, observation).item() == pytest.approx(4.0)
    assert aggregate(values, observation.clone()).item() == pytest.approx(4.0)
    assert aggregate.is_observation(observation.clone())
    assert not aggregate.is_observation(action * observation)
