"""The outcome file format."""

from __future__ import annotations

import pytest
from rllm_core.types import Termination
from rllm_harness_cli.outcome import AgentOutcome, parse_outcome


def test_a_full_outcome_file():
    data = b'{"termination": "max_turns", "turns": 12, "answer": "42", "metadata": {"k": 1}}'
    assert parse_outcome(data) == AgentOutcome(
        termination=Termination.MAX_TURNS, turns=12, answer="42", metadata={"k": 1}
    )


def test_only_the_termination_is_required_and_other_fields_are_ignored():
    assert parse_outcome(b'{"termination": "done", "cost": 3}') == AgentOutcome(
        termination=Termination.DONE
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"turns": 3}', "missing required field `termination`"),
        (b'{"termination": "finished"}', "termination is one of: done, max_turns, timeout"),
        (b'{"termination": "done", "turns": -1}', "Expected `int` >= 0"),
        (b'{"termination": "done", "answer": 4}', "Expected `str | null`, got `int`"),
        (b"DONE", "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
def test_a_bad_outcome_file_says_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        parse_outcome(data)
