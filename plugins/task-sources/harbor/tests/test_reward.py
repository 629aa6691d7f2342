"""Reading reward files: reward.txt holds one number, reward.json a reward and signals."""

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
        (JSON, '{"score": 1}', 'has no "reward" field'),
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
