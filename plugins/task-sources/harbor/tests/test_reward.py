"""Reading reward files: reward.txt holds one number, reward.json named rewards, of which
one scalar is trained on and the rest are signals."""

from __future__ import annotations

import pytest
from rllm_core.errors import RewardFileInvalid
from rllm_core.types import Grade
from rllm_task_source_harbor.verifier import parse_reward

TXT = "/logs/verifier/reward.txt"
JSON = "/logs/verifier/reward.json"


@pytest.mark.parametrize(
    ("content", "reward"),
    [("1", 1.0), ("0", 0.0), ("0.75\n", 0.75), ("  1.0  \n\n", 1.0), ("-0.5", -0.5), ("1e0", 1.0)],
)
def test_reward_txt(content, reward):
    assert parse_reward(TXT, content, task_id="t") == Grade(reward=reward)


def test_reward_json_with_signals():
    content = (
        '{"reward": 0.75, "tests_passed": 3, "duration": 1.5, "ok": true, "note": "x",'
        ' "failed": ["a"], "details": {"tests_total": 4, "name": "n", "deep": {"x": 2}}}'
    )
    assert parse_reward(JSON, content, task_id="t") == Grade(
        reward=0.75,
        signals={
            "tests_passed": 3.0,
            "duration": 1.5,
            "details.tests_total": 4.0,
            "details.deep.x": 2.0,
        },
    )


def test_reward_json_integer_reward():
    assert parse_reward(JSON, '{"reward": 1}', task_id="t") == Grade(reward=1.0)


NAMED = '{"correctness": 1, "style": 0.5, "speed": 0}'


def test_reward_key_picks_the_named_reward_and_every_reward_is_a_signal():
    grade = parse_reward(JSON, NAMED, task_id="t", reward_key="style")
    assert grade == Grade(reward=0.5, signals={"correctness": 1.0, "style": 0.5, "speed": 0.0})


def test_reward_key_beats_a_field_named_reward_and_reaches_nested_fields():
    content = '{"reward": 0.2, "checks": {"strict": 0.9}}'
    grade = parse_reward(JSON, content, task_id="t", reward_key="checks.strict")
    assert grade == Grade(reward=0.9, signals={"checks.strict": 0.9})


def test_without_a_key_the_field_named_reward_is_trained_on():
    grade = parse_reward(JSON, '{"style": 0.5, "reward": 0.25}', task_id="t")
    assert grade == Grade(reward=0.25, signals={"style": 0.5})


def test_a_single_named_reward_is_trained_on():
    grade = parse_reward(JSON, '{"correctness": 0.75, "note": "ok"}', task_id="t")
    assert grade == Grade(reward=0.75, signals={"correctness": 0.75})


def test_several_named_rewards_without_reward_or_key_give_their_mean():
    grade = parse_reward(JSON, NAMED, task_id="t")
    assert grade.reward == pytest.approx(0.5)
    assert grade.signals == {"correctness": 1.0, "style": 0.5, "speed": 0.0}


def test_reward_txt_ignores_the_reward_key():
    assert parse_reward(TXT, "0.5", task_id="t", reward_key="style") == Grade(reward=0.5)


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("task.toml [verifier]", "the reward_key of task.toml [verifier]"),
        ("the task source", "the reward_key of the task source"),
    ],
)
def test_a_reward_key_missing_from_reward_json_names_the_key_and_what_is_there(source, where):
    with pytest.raises(RewardFileInvalid) as info:
        parse_reward(JSON, NAMED, task_id="t", reward_key="safety", reward_key_source=source)
    assert str(info.value).startswith(
        f"task t: reward file {JSON} has no numeric reward named 'safety' ({where});"
        " it holds correctness, style, speed;"
    )


@pytest.mark.parametrize(
    ("path", "content", "reason"),
    [
        (TXT, "", "is empty"),
        (TXT, " \n\t", "is empty"),
        (TXT, "pass", "must hold one number, got 'pass'"),
        (TXT, "1 0", "must hold one number"),
        (TXT, "nan", "non-finite reward 'nan'"),
        (TXT, "inf", "non-finite reward"),
        (JSON, "", "is empty"),
        (JSON, "{reward: 1}", "is not valid JSON"),
        (JSON, "[1]", "must hold a JSON object"),
        (JSON, '{"note": "x", "ok": true, "list": [1]}', "holds no numeric reward"),
        (JSON, "{}", "holds no numeric reward"),
        (JSON, '{"reward": "1"}', "non-numeric reward '1'"),
        (JSON, '{"reward": true}', "non-numeric reward True"),
        (JSON, '{"reward": NaN}', "non-finite reward nan"),
        (JSON, '{"reward": Infinity}', "non-finite reward inf"),
        (
            JSON,
            '{"reward": 1, "time": NaN, "d": {"x": -Infinity}}',
            "non-finite values in time, d.x",
        ),
    ],
)
def test_invalid_reward_files_are_typed_errors(path, content, reason):
    with pytest.raises(RewardFileInvalid) as info:
        parse_reward(path, content, task_id="task-9")
    error = info.value
    assert reason in str(error)
    assert str(error).startswith(f"task task-9: reward file {path} ")
    assert (error.task_id, error.path, error.content) == ("task-9", path, content)
